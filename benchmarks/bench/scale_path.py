"""``bench --scale``: N ranks on N nodes, each storing one shard of every Ray Train
report round into replicated node storage: what each node's raylet receives and
sends per round, what each node's disk holds after, the time per round, and what a
restore of the latest checkpoint moves per node; for today's layout (every copy on
the storage node and the replica node) and, where the installed
``storage_filesystem`` has it, ``placement="writer"``.

For each ``--ranks`` N, a mock cluster (``ray.cluster_utils.Cluster``) of N + 2
nodes: the storage node (the head, the driver's), a replica node and N worker
nodes. On every cluster, for each ``--placement``, one Train run
(``DataParallelTrainer``, N workers, one per worker node: no process group, as the
ranks only report) into ``storage_filesystem(replicas=2, replica_nodes=(replica
node,), replica_root=<run>/{node_id})`` (the mock nodes share one disk: each copy
has its own root, named by its node id), ``num_to_keep=2``. Each of ``--rounds``
rounds every rank writes ``--scale-mib`` random bytes as ``shard-<rank>.bin`` into
a fresh directory and calls ``ray.train.report`` with it (``SYNC``: it returns once
the round is stored on every copy and committed), the real path of a sharded
checkpoint. A gate actor holds the ranks before each round while the driver reads
every raylet's ``ray_object_manager_bytes`` (``pushed.py``), so each round's bytes
are its own. After the run: the bytes allocated under each node's roots (its copy
and the bytes it holds for writer placement), then every rank, on
its node, copies its own shard of the latest checkpoint out of the checkpoint's
filesystem at once (a restart's restore), with the counters read around it. Every
restored shard is compared with what its rank stored.

Bytes are reported as shards (``--scale-mib``); a round's time is from the first
rank's report call to the last rank's return (the ranks share this machine's
clock). Memory is not prefaulted (the machine is shared; the counts are bytes):
the first round carries first-use costs, so the median round is reported.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import os
import shutil
import threading
from collections.abc import Iterator
from typing import Any

import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import TransferConfig, storage_filesystem
from benchmarks.bench import pushed
from benchmarks.bench.measure import error_reason
from benchmarks.bench.report import run_config
from benchmarks.bench.runner import progress
from benchmarks.bench.scale_ranks import new_gate, rank_loop, restore_on
from benchmarks.bench.scale_report import SCALE_METRICS, node_row, run_row
from benchmarks.bench.session import auto_store_bytes, machine_info, ray_session
from benchmarks.units import MiB

STORAGE = "scale_storage"
REPLICA = "scale_replica"
#: The resource each worker node has one of: one Train worker per worker node.
RANK_RESOURCE = "scale_rank"
PLACEMENTS = ("storage", "writer")
REPLICAS = 2
NUM_TO_KEEP = 2
#: How long the driver waits for the ranks at a gate before it looks at the run again.
GATE_POLL_S = 1.0


def worker_nodes(ranks: int) -> list[str]:
    """The custom resource naming each worker node."""
    return [f"scale_worker_{i}" for i in range(1, ranks + 1)]


def placement_supported() -> bool:
    """Whether the installed ``storage_filesystem`` takes ``placement``."""
    return "placement" in inspect.signature(storage_filesystem).parameters


def placements(wanted: list[str], supported: bool) -> list[str]:
    """The placements to measure, in ``PLACEMENTS`` order: ``writer`` only where the
    installed ``storage_filesystem`` has it (said in one line), else ``storage``."""
    chosen = [p for p in PLACEMENTS if p in wanted]
    if "writer" in chosen and not supported:
        progress(
            "--placement writer: the installed storage_filesystem has no placement "
            "parameter; measuring today's layout (storage) only"
        )
        chosen = [p for p in chosen if p != "writer"] or ["storage"]
    return chosen


def node_roots(base: str, node: str) -> list[str]:
    """Where node ``node`` keeps bytes in a run under ``base``: its copy of node storage
    (``<node id>``) and, with ``placement="writer"``, the file bytes it holds
    (``<node id>.placed``)."""
    return [os.path.join(base, node), os.path.join(base, f"{node}.placed")]


def _files(roots: list[str]) -> Iterator[str]:
    for root in roots:
        for dirpath, _, filenames in os.walk(root):
            for name in filenames:
                yield os.path.join(dirpath, name)


def disk_bytes(roots: list[str]) -> int:
    """Bytes allocated on disk to every file under ``roots`` (blocks, not apparent
    sizes: a writer-placed file's record on the storage node is a sparse file of the
    file's size that holds a few KiB; 0 for roots that do not exist)."""
    return sum(os.lstat(path).st_blocks * 512 for path in _files(roots))


def own_shard_files(roots: list[str], size: int, shas: set[str]) -> int:
    """How many of a rank's shards (one per kept checkpoint, known by their sha256
    ``shas``) lie under ``roots``, its node's, whatever name they are kept under."""
    found = 0
    for path in _files(roots):
        if os.lstat(path).st_size != size:
            continue
        sha = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(16 * MiB):
                sha.update(block)
        found += sha.hexdigest() in shas
    return found


class Rounds:
    """The driver's side of the gate, in a thread: at each of ``rounds`` + 1 gates,
    once every rank is there, read the counters and let the ranks go. Every gate is
    opened in the end, even if a reading failed, so no rank waits forever."""

    def __init__(self, gate: Any, rounds: int) -> None:
        self.gate, self.rounds = gate, rounds
        self.readings: list[pushed.Bytes] = []
        self.error: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="scale-rounds", daemon=True)
        self.urls = pushed.endpoints()

    def _run(self) -> None:
        try:
            for round_ in range(self.rounds + 1):
                here = self.gate.wait_all_arrived.remote(round_)
                while not ray.wait([here], timeout=GATE_POLL_S)[0]:
                    if self.stop.is_set():
                        return
                last = self.readings[-1] if self.readings else None
                self.readings.append(pushed.snapshot(self.urls, changed_from=last))
                self.gate.open.remote(round_)
        except Exception as e:
            self.error = f"reading the counters: {type(e).__name__}: {e}"
        finally:
            for round_ in range(self.rounds + 1):
                self.gate.open.remote(round_)

    def per_round(self) -> list[pushed.Bytes]:
        return [pushed.delta(a, b) for a, b in zip(self.readings, self.readings[1:], strict=False)]


def run_once(
    opts: argparse.Namespace,
    config: TransferConfig,
    ranks: int,
    placement: str,
    ids: dict[str, str],
) -> dict[str, Any]:
    """One Train run of ``ranks`` ranks into ``placement``'s storage, then the
    restore; its row (see ``scale_report.run_row``)."""
    shard = opts.scale_mib * MiB
    base = os.path.join(opts.data_dir, "scale", f"{placement}-{ranks}")
    shutil.rmtree(base, ignore_errors=True)
    os.makedirs(base)
    storage, replica = ids[STORAGE], ids[REPLICA]
    gate = new_gate(ranks)
    rounds = Rounds(gate, opts.scale_rounds)
    try:
        # Passed only where asked: the installed storage_filesystem may not take it.
        extra: dict[str, Any] = {"placement": "writer"} if placement == "writer" else {}
        fs = storage_filesystem(
            node=storage, config=config, root=os.path.join(base, storage), replicas=REPLICAS,
            replica_nodes=(replica,), replica_root=os.path.join(base, "{node_id}"), **extra,
        )  # fmt: skip
        trainer = DataParallelTrainer(
            rank_loop,
            train_loop_config={"gate": gate, "rounds": opts.scale_rounds, "shard_bytes": shard},
            scaling_config=ray.train.ScalingConfig(
                num_workers=ranks, resources_per_worker={"CPU": 1, RANK_RESOURCE: 1}
            ),
            run_config=ray.train.RunConfig(
                name="scale",
                storage_path=os.path.join(base, storage, "runs"),
                storage_filesystem=fs,
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=NUM_TO_KEEP),
            ),
        )
        rounds.thread.start()
        try:
            result = trainer.fit()
        finally:
            rounds.stop.set()
            rounds.thread.join()
        if rounds.error:
            raise RuntimeError(rounds.error)
        record = ray.get(gate.record.remote())
        names = {storage: "storage", replica: "replica"}
        names |= {node: f"rank{rank}" for rank, node in sorted(record["nodes"].items())}
        disks = {node: disk_bytes(node_roots(base, node)) for node in ids.values()}
        own = {
            node: own_shard_files(node_roots(base, node), shard, record["shards"][rank])
            for rank, node in record["nodes"].items()
        }
        restore = _restore(opts, result.checkpoint, record, placement, ranks, rounds.urls)
    except Exception as e:
        return run_row(placement, ranks, shard, opts.scale_rounds, error_reason(e, False, 0))
    finally:
        ray.kill(gate)
        shutil.rmtree(base, ignore_errors=True)
    moved, restore_s, wrong = restore
    per_round = rounds.per_round()
    ranked = [node for _, node in sorted(record["nodes"].items())]
    order = [storage, replica, *ranked, *(n for n in ids.values() if n not in names)]
    nodes = {
        names.get(node, node[:12]): node_row(
            node, per_round, disks.get(node, 0), moved, shard, own.get(node)
        )
        for node in order
    }
    times = record["times"]
    round_s = [
        max(end for _, end in times[r].values()) - min(start for start, _ in times[r].values())
        for r in sorted(times)
    ]
    return run_row(
        placement, ranks, shard, opts.scale_rounds, wrong,
        nodes=nodes, round_s=round_s, restore_s=restore_s, kept=NUM_TO_KEEP * ranks,
        moved=[pushed.pushed_ratios(m, shard, names) for m in per_round],
        restore_moved=pushed.pushed_ratios(moved, shard, names),
    )  # fmt: skip


def _restore(
    opts: argparse.Namespace,
    checkpoint: ray.train.Checkpoint | None,
    record: dict[str, Any],
    placement: str,
    ranks: int,
    urls: dict[str, str],
) -> tuple[pushed.Bytes, list[float], str | None]:
    """Every rank copies its shard of ``checkpoint`` on its node, all at once: Ray's
    bytes moved meanwhile, each rank's seconds, and the first shard that differs
    from what its rank stored last (None: all verified)."""
    if checkpoint is None:
        raise RuntimeError("the run reported no checkpoint")
    before = pushed.snapshot(urls)
    out = os.path.join(opts.data_dir, "out", f"scale-{placement}-{ranks}")
    calls = [
        restore_on(node).remote(checkpoint, rank, f"{out}-{rank}")
        for rank, node in sorted(record["nodes"].items())
    ]
    done = ray.get(calls)
    moved = pushed.delta(before, pushed.snapshot(urls, changed_from=before))
    wrong = None
    for (rank, _), (_, digest) in zip(sorted(record["nodes"].items()), done, strict=True):
        if digest != record["digests"][rank]:
            wrong = f"rank {rank}'s restored shard differs from the one it stored last"
    return moved, [round(s, 4) for s, _ in done], wrong


def run_scale(opts: argparse.Namespace) -> dict[str, Any]:
    """The ``--scale`` run (see the module docstring); returns the JSON report."""
    opts.data_dir = os.path.abspath(os.path.expanduser(opts.data_dir))
    os.makedirs(opts.data_dir, exist_ok=True)
    config = TransferConfig(
        chunk_bytes=opts.chunk_mib * MiB,
        window=opts.window,
        direct_io=opts.direct_io,
        progress=opts.progress,
    )
    chosen = placements(opts.placement, placement_supported())
    results: list[dict[str, Any]] = []
    store = 0
    for ranks in sorted(set(opts.ranks)):
        nodes = [STORAGE, REPLICA, *worker_nodes(ranks)]
        store = opts.object_store_mb * MiB if opts.object_store_mb else 0
        store = store or auto_store_bytes(ranks * opts.scale_mib * MiB, True, len(nodes))
        with ray_session(
            True, opts.num_cpus, store, nodes,
            system_config={"metrics_report_interval_ms": pushed.REPORT_MS},
            node_resources={name: {RANK_RESOURCE: 1} for name in worker_nodes(ranks)},
        ) as how:  # fmt: skip
            progress(f"{how}: storage node (the driver's), replica node, {ranks} worker nodes")
            ids = {
                next(r for r in nodes if r in n["Resources"]): n["NodeID"]
                for n in ray.nodes()
                if n["Alive"]
            }
            for placement in chosen:
                row = run_once(opts, config, ranks, placement, ids)
                progress(f"  {placement}, {ranks} ranks: {row['status']} {row['reason'] or ''}")
                results.append(row)
    return {
        "mode": "scale",
        "config": {
            **run_config(opts, config, chosen, store, SCALE_METRICS),
            "replicas": REPLICAS,
            "num_to_keep": NUM_TO_KEEP,
            "placement_supported": placement_supported(),
        },
        "machine": machine_info(opts.data_dir),
        "results": results,
    }
