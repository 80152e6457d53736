"""``bench --dcp``: torch DCP save and restore from 2 ranks, Ray's recipe beside ours.

A mock cluster of three nodes: the driver's (the storage node, where no rank runs)
and one node per rank. The state is an MLP of ``--dcp-mib`` MiB of parameters
(1024x1024 layers) plus its Adam state (``exp_avg``, ``exp_avg_sq``: 3x the
parameters in all), *sharded by hand*: rank r owns the layers ``i % 2 == r``, so
each rank saves and restores half of it. Each contender is one Train run
(``TorchTrainer``, gloo) that saves once and restores what it saved:

- ``ray-recipe``: every rank ``dcp.save``s into a local temp dir and
  ``ray.train.report(checkpoint=Checkpoint.from_directory(tmp))`` (Train uploads it
  into a local ``storage_path``); restore: ``as_directory()`` + ``dcp.load``.
- ``air-transfer``: ``air_transfer.dcp.report`` / ``air_transfer.dcp.load`` with
  ``RunConfig(storage_filesystem=air_transfer.storage_filesystem())``.
- ``air-incremental``: the same into incremental node storage, then a second save
  with ~90% of the bytes unchanged (``bench.dcp_incremental``: bytes it sent).
- ``raw-ray-floor``: each rank's tensors' bytes ``ray.put`` and written into a file
  on the storage node by an actor pinned there, and read back the same way: the
  cost of the bytes alone, measured by ``ray-recipe``'s ranks after their own save
  and restore (``bench.dcp_floor``; no Train run of its own).

Figures: each rank's blocking time in save (``save_s``: dcp.save + report, or
``dcp.report``), the save's wall time (until Train has committed it), the restore's
wall time and each rank's, and bytes per rank on restore. Ours: the storage agent's
``bytes_served`` delta while that rank alone loads its part (the other rank loads
an empty state dict in the same collective); a small item of another rank's file
(DCP stores the replicated ``step`` once) costs that rank one chunk
(``--chunk-mib``) of it. Ray's: the size of the directory
``as_directory()`` gave that rank, which is the whole checkpoint: on one machine it
is the stored directory in place; on a real cluster it is downloaded onto each node.
Every restore is compared tensor by tensor with what was saved.

Load memory (``load_anon_bytes``, per rank; the table's ``load +MiB``): the peak
growth of the rank's private memory (``RssAnon``, sampled every 5 ms:
``bench.dcp_memory``) during the restore's ``dcp.load`` / ``air_transfer.dcp.load``,
over its value just before it (the zeroed target already allocated);
``load_anon_beyond_ray_bytes``: that less Ray's recipe's (torch's
``FileSystemReader``), per rank; ``config.largest_tensor_mib``: the largest tensor.
Async save (``air-transfer`` only; ``bench.dcp_async``): after the synchronous save
and restore, three rounds of ``staging_s`` (DCP's own staging of the state dict to
CPU) and ``async_save_s`` (the blocking part of ``air_transfer.dcp.report(...,
checkpoint_upload_mode=ASYNC)``) in turn, each the rank's median, the rounds kept
(``*_rounds_s``); ``async_to_staging`` (their ratio, per rank), ``async_done_s``
(until the save completed), ``async_reported`` (checkpoints committed by then: 4);
the last save is restored and verified too.
CPU (``save_cpu_s``, ``restore_cpu_s``; ``bench.dcp_cpu``): the CPU seconds of each
process of the session during the save and the restore (each rank, the storage
node's agent, the raylets, the rest), from the phase's start to its end.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from typing import Any

import ray
import ray.train

import air_transfer
from air_transfer import TransferConfig
from benchmarks.bench.dcp_async import add_async_save, async_save, format_async_save
from benchmarks.bench.dcp_cpu import PhaseCpu, add_phase_cpu, format_phase_cpu
from benchmarks.bench.dcp_floor import floor_row, floor_trip, start_storage_end
from benchmarks.bench.dcp_incremental import CONTENDER as INCREMENTAL
from benchmarks.bench.dcp_incremental import add_second_save, format_second_save, second_save
from benchmarks.bench.dcp_memory import EVERY_S, PeakPrivateGrowth
from benchmarks.bench.dcp_state import SIDE, WORLD, equal, layer_count, sharded_state, zeroed
from benchmarks.bench.runner import progress
from benchmarks.bench.session import machine_info, ray_session
from benchmarks.units import MiB

RAY_RECIPE = "ray-recipe"
OURS = "air-transfer"
#: The storage node (the driver's) and two nodes sharing the resource each rank takes.
NODES = ("storage", "rank", "rank")


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def dcp_loop(config: dict[str, Any]) -> None:
    """One save and one restore of this rank's part, timed; results to the log."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    import air_transfer.dcp

    rank = ray.train.get_context().get_world_rank()
    state = sharded_state(rank, config["layers"])
    ours = config["contender"] != RAY_RECIPE
    out: dict[str, Any] = {"rank": rank, "node": ray.get_runtime_context().get_node_id()}
    agent = air_transfer.node_agent(config["storage_node"]) if ours else None
    phase_cpu = PhaseCpu(rank, config["driver_pid"], ray.get(agent.pid.remote()) if agent else None)
    phase_cpu.mark()
    start = time.perf_counter()
    if ours:
        air_transfer.dcp.report({"step": 1}, state_dict=state)
        out["local_temp_bytes"] = 0
    else:
        with tempfile.TemporaryDirectory() as tmp:
            dcp_save(state, checkpoint_id=tmp)
            out["local_temp_bytes"] = tree_bytes(tmp)
            ray.train.report({"step": 1}, checkpoint=ray.train.Checkpoint.from_directory(tmp))
    out["save_s"] = time.perf_counter() - start
    [reported] = ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
    )
    out["save_wall_s"] = time.perf_counter() - start
    checkpoint = reported.checkpoint
    out["save_cpu_s"] = phase_cpu.mark()
    start = time.perf_counter()
    restored = zeroed(state)
    if ours:
        with PeakPrivateGrowth() as memory:
            assert air_transfer.dcp.load(restored, checkpoint)
    else:
        with checkpoint.as_directory() as d:
            out["restore_bytes"] = tree_bytes(d)
            with PeakPrivateGrowth() as memory:
                dcp_load(restored, checkpoint_id=d)
    out["restore_s"] = time.perf_counter() - start
    out["load_anon_bytes"] = memory.growth
    dist.barrier()
    out["restore_wall_s"] = time.perf_counter() - start
    out["restore_cpu_s"] = phase_cpu.mark()
    out["verified"] = equal(restored, state)
    if agent is not None:  # each rank's bytes alone: the other loads nothing meanwhile
        for alone in range(WORLD):
            dist.barrier()
            before = ray.get(agent.read_counters.remote())["bytes_served"]
            dist.barrier()
            air_transfer.dcp.load(zeroed(state) if rank == alone else {}, checkpoint)
            dist.barrier()
            if rank == alone:
                after = ray.get(agent.read_counters.remote())["bytes_served"]
                out["restore_bytes"] = after - before
    out["state_bytes"] = sum(v.nbytes for v in state.values() if hasattr(v, "nbytes"))
    if config["contender"] == RAY_RECIPE:
        floor_trip(state, config["storage_end"], out, equal, zeroed)
    if config["contender"] == OURS:
        async_save(state, out, equal, zeroed)
    if config["contender"] == INCREMENTAL:
        second_save(state, config, out, equal, zeroed)
    ray.get(config["log"].add.remote(out))


class RankLog:
    """Where the ranks record what they measured."""

    def __init__(self) -> None:
        self.ranks: list[dict[str, Any]] = []

    def add(self, out: dict[str, Any]) -> None:
        self.ranks.append(out)

    def get(self) -> list[dict[str, Any]]:
        return sorted(self.ranks, key=lambda r: int(r["rank"]))


def run_contender(
    contender: str, layers: int, storage_dir: str, storage_node: str, config: TransferConfig
) -> dict[str, Any]:
    """One Train run of ``contender``: its row of the report."""
    from ray.train.torch import TorchTrainer

    log: Any = ray.remote(num_cpus=0)(RankLog).remote()
    ours = contender != RAY_RECIPE
    end = None if ours else start_storage_end(storage_node, storage_dir, WORLD)
    if contender == INCREMENTAL:
        config = config.replace(incremental=True)
    fs = (
        air_transfer.storage_filesystem(node=storage_node, config=config, root=storage_dir)
        if ours
        else None
    )
    trainer = TorchTrainer(
        dcp_loop,
        train_loop_config={
            "contender": contender,
            "layers": layers,
            "log": log,
            "storage_node": storage_node,
            "storage_end": end,
            "driver_pid": os.getpid(),
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=WORLD, resources_per_worker={"CPU": 1, "rank": 1}
        ),
        run_config=ray.train.RunConfig(
            name=f"dcp-{contender}", storage_path=storage_dir, storage_filesystem=fs
        ),
    )
    row: dict[str, Any] = {"contender": contender, "status": "ok", "reason": None}
    try:
        trainer.fit()
        ranks = ray.get(log.get.remote())
    except Exception as e:
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:2000]}
    finally:
        ray.kill(log)
        if end is not None:
            ray.kill(end)
    row["ranks"] = ranks
    row["verified"] = len(ranks) == WORLD and all(r["verified"] for r in ranks)
    keys = ("save_s", "restore_s", "restore_bytes", "local_temp_bytes", "state_bytes",
            "load_anon_bytes")  # fmt: skip
    for key in keys:
        row[key] = [r[key] for r in ranks]
    row["save_wall_s"] = max(r["save_wall_s"] for r in ranks)
    row["restore_wall_s"] = max(r["restore_wall_s"] for r in ranks)
    add_phase_cpu(row, ranks)
    if contender == OURS:
        add_async_save(row, ranks)
    if contender == INCREMENTAL:
        add_second_save(row, ranks)
    if not row["verified"]:
        row["status"], row["reason"] = "failed", "a restore differs from what was saved"
    return row


def add_restore_ratio(rows: list[dict[str, Any]]) -> None:
    """Each row's restore bytes per rank as a fraction of Ray's recipe's, and its
    load's peak private memory growth per rank less Ray's recipe's (torch's reader)."""
    by = {r["contender"]: r for r in rows if r["status"] == "ok"}
    base = by.get(RAY_RECIPE)
    for r in rows:
        ok = base is not None and r["status"] == "ok"
        r["restore_bytes_ratio_to_ray"] = (
            [a / b for a, b in zip(r["restore_bytes"], base["restore_bytes"], strict=True)]
            if ok and base
            else None
        )
        r["load_anon_beyond_ray_bytes"] = (
            [a - b for a, b in zip(r["load_anon_bytes"], base["load_anon_bytes"], strict=True)]
            if ok and base and r["load_anon_bytes"] is not None
            else None
        )


def run_dcp(opts: argparse.Namespace) -> dict[str, Any]:
    """The ``--dcp`` run (see the module docstring); returns the JSON report."""
    layers = layer_count(opts.dcp_mib)
    config = TransferConfig(chunk_bytes=opts.chunk_mib * MiB, window=opts.window)
    opts.data_dir = os.path.abspath(os.path.expanduser(opts.data_dir))
    os.makedirs(opts.data_dir, exist_ok=True)
    store = (opts.object_store_mb or 1024) * MiB
    rows = []
    with ray_session(True, opts.num_cpus, store, nodes=NODES) as how:
        progress(f"{how}: storage on the driver's node, {WORLD} ranks on the other two; "
                 f"{layers} layers of {SIDE}x{SIDE} (+ Adam state), sharded by hand")  # fmt: skip
        storage_node = str(ray.get_runtime_context().get_node_id())
        for contender in (RAY_RECIPE, OURS, INCREMENTAL):
            storage_dir = tempfile.mkdtemp(prefix="dcp-", dir=opts.data_dir)
            progress(f"{contender}: save and restore")
            try:
                rows.append(run_contender(contender, layers, storage_dir, storage_node, config))
            finally:
                shutil.rmtree(storage_dir, ignore_errors=True)
            if contender == RAY_RECIPE:  # its ranks measured the floor too
                rows.insert(0, floor_row(rows[-1]))
    add_restore_ratio(rows)
    return {
        "mode": "dcp",
        "config": {
            "model_mib": layers * (SIDE * SIDE + SIDE) * 4 / MiB,
            "layers": layers,
            "layer_shape": [SIDE, SIDE],
            "largest_tensor_mib": SIDE * SIDE * 4 / MiB,
            "optimizer": "Adam (exp_avg, exp_avg_sq per parameter)",
            "world_size": WORLD,
            "chunk_mib": opts.chunk_mib,
            "state": "sharded by hand: rank r owns the layers i % 2 == r",
            "nodes": "storage node (driver) + one node per rank, on one machine",
            "ray_recipe_restore_bytes": "size of the directory as_directory() gave the rank",
            "ours_restore_bytes": "storage agent's bytes_served delta, that rank loading alone",
            "floor_restore_bytes": "size of the file the rank's tensors were written into",
            "load_anon_bytes": "peak RssAnon growth during the restore's load, sampled "
            f"every {EVERY_S * 1000:g} ms",
        },
        "machine": machine_info(opts.data_dir),
        "results": rows,
    }


def format_dcp_table(rows: list[dict[str, Any]]) -> str:
    """Per contender: save blocking per rank, save wall, restore wall, bytes per rank."""
    head = ("contender", "save_s r0/r1", "save_wall", "restore_wall", "restore MiB r0/r1",
            "temp MiB r0/r1", "load +MiB r0/r1", "ok")  # fmt: skip
    lines = ["{:<15} {:>13} {:>9} {:>12} {:>17} {:>14} {:>15} {:>3}".format(*head)]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['contender']:<15} {r['status']}: {r['reason']}")
            continue

        def pair(key: str, scale: float = 1.0, r: dict[str, Any] = r) -> str:
            digits = 2 if scale == 1 else 0
            return "/".join(f"{v / scale:.{digits}f}" for v in r[key]) if r[key] else "-"

        lines.append(
            f"{r['contender']:<15} {pair('save_s'):>13} {r['save_wall_s']:>9.2f} "
            f"{r['restore_wall_s']:>12.2f} {pair('restore_bytes', MiB):>17} "
            f"{pair('local_temp_bytes', MiB):>14} {pair('load_anon_bytes', MiB):>15} "
            f"{'yes' if r['verified'] else 'NO':>3}"
        )
    extra = [format_async_save(rows), format_second_save(rows), format_phase_cpu(rows)]
    extra = [line for line in extra if line]
    return "\n".join([*lines, *extra])
