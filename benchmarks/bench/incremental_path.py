"""``bench --incremental``: successive Ray Train reports that share 90% of their
bytes, stored incrementally beside today's full reports.

A 2-node mock cluster (``--cross-node``'s): node storage on the driver's node, one
Train worker on the other. The checkpoint (``--incremental-mib``) is ten files of
equal size; each of ``REPORTS`` reports keeps nine (a frozen model: hard links of
the same source files into the report's directory, as a loop writing the same
bytes would) and writes the tenth anew (10% changed). Two contenders, each one
Train run with ``num_to_keep=None``:

- ``full``: ``storage_filesystem()`` as it is by default, every byte sent and
  written each report;
- ``incremental``: ``storage_filesystem(config=TransferConfig(incremental=True))``.

Figures: bytes over the wire (``incremental``: the storage agent's ``bytes_sent``;
``full``: the checkpoint, by construction: every chunk crosses), bytes written
(``bytes_written``; ``full``: the checkpoint), disk used by all reports (each inode
counted once, in allocated blocks) as a multiple of one checkpoint, and each
report's blocking time in the worker. Every stored checkpoint is compared with its
source.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import TransferConfig, node_agent, storage_filesystem
from benchmarks.bench.data import tree_digest
from benchmarks.bench.runner import progress
from benchmarks.bench.session import CROSS_NODES, machine_info, ray_session
from benchmarks.units import MiB

FULL = "full"
INCREMENTAL = "incremental"
REPORTS = 5
FILES = 10  # one changes per report: 90% of the bytes unchanged


def make_sources(parent: str, total_bytes: int) -> list[str]:
    """The ``REPORTS`` report directories: ``FILES - 1`` files shared by all (hard
    links of one copy) and one file of new bytes each."""
    size = max(1, total_bytes // FILES)
    frozen = os.path.join(parent, "frozen")
    os.makedirs(frozen)
    for i in range(FILES - 1):
        _random_file(os.path.join(frozen, f"layer{i}.bin"), size)
    sources = []
    for r in range(REPORTS):
        d = os.path.join(parent, f"report{r}")
        os.makedirs(d)
        for name in os.listdir(frozen):
            os.link(os.path.join(frozen, name), os.path.join(d, name))
        _random_file(os.path.join(d, "head.bin"), size)
        sources.append(d)
    return sources


def _random_file(path: str, size: int) -> None:
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 16 * MiB))
            f.write(block)
            left -= len(block)


def disk_used(root: str) -> int:
    """Bytes allocated under ``root``, each inode once (hard links share one)."""
    seen: dict[tuple[int, int], int] = {}
    for dirpath, _, filenames in os.walk(root):
        for name in filenames:
            st = os.lstat(os.path.join(dirpath, name))
            seen[st.st_dev, st.st_ino] = st.st_blocks * 512
    return sum(seen.values())


def report_loop(config: dict[str, Any]) -> None:
    """The training worker: one timed report per source (``config["mode"]``: Ray's
    upload mode, SYNC by default), each report's blocking time to ``config["log"]``.
    With ``config["spaced"]``, after each report (off the clock) it waits until Train
    has registered it, as a loop whose steps between reports outlast the controller's
    poll finds Train: otherwise a report made before the controller took the last one
    waits for that poll in Train's queue of one, whatever the storage."""
    mode = ray.train.CheckpointUploadMode[config.get("mode", "SYNC")]
    for i, path in enumerate(config["sources"]):
        os.sync()  # the previous report's writes are not flushed on this one's clock
        start = time.perf_counter()
        ray.train.report(
            {"report": i},
            checkpoint=ray.train.Checkpoint.from_directory(path),
            checkpoint_upload_mode=mode,
            delete_local_checkpoint_after_upload=False,
        )
        ray.get(config["log"].append.remote(time.perf_counter() - start))
        if config.get("spaced"):
            committed = ray.train.CheckpointConsistencyMode.COMMITTED
            ray.train.get_all_reported_checkpoints(consistency_mode=committed)


class TimeLog:
    """Where the worker puts each report's seconds (an actor: ``new_time_log``)."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    def append(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def get(self) -> list[float]:
        return self.seconds


def new_time_log() -> Any:
    return ray.remote(num_cpus=0)(TimeLog).remote()


def run_contender(
    contender: str, sources: list[str], storage_node: str, config: TransferConfig, data_dir: str
) -> dict[str, Any]:
    """One Train run of ``contender``; its row."""
    storage_dir = tempfile.mkdtemp(prefix="incremental-", dir=data_dir)
    fs = storage_filesystem(node=storage_node, config=config, root=storage_dir)
    agent = node_agent(storage_node)
    before = ray.get(agent.incremental_counters.remote())
    log: Any = new_time_log()
    first = sources[0]
    checkpoint_bytes = sum(os.path.getsize(os.path.join(first, n)) for n in os.listdir(first))
    try:
        result = DataParallelTrainer(
            report_loop,
            train_loop_config={"sources": sources, "log": log},
            scaling_config=ray.train.ScalingConfig(
                num_workers=1, resources_per_worker={"CPU": 1, CROSS_NODES[1]: 0.01}
            ),
            run_config=ray.train.RunConfig(
                name=contender,
                storage_path=storage_dir,
                storage_filesystem=fs,
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
            ),
        ).fit()
        seconds: list[float] = ray.get(log.get.remote())
        after = ray.get(agent.incremental_counters.remote())
        stored = {m["report"]: c.path for c, m in result.best_checkpoints or []}
        verified = len(stored) == REPORTS and all(
            tree_digest(stored[i]) == tree_digest(sources[i]) for i in range(REPORTS)
        )
        total = REPORTS * checkpoint_bytes
        incremental = config.incremental
        row = {
            "contender": contender,
            "status": "ok" if verified else "failed",
            "reason": None if verified else "a stored checkpoint differs from its source",
            "checkpoint_bytes": checkpoint_bytes,
            "sent_bytes": after["bytes_sent"] - before["bytes_sent"] if incremental else total,
            "written_bytes": (
                after["bytes_written"] - before["bytes_written"] if incremental else total
            ),
            "disk_bytes": disk_used(storage_dir),
            "report_s": seconds,
            "report_median_s": statistics.median(seconds) if seconds else None,
        }
    finally:
        ray.kill(log)
        shutil.rmtree(storage_dir, ignore_errors=True)
    return row


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's bytes sent and written as a fraction of ``full``'s, its disk as a
    multiple of one checkpoint, its report time as a multiple of ``full``'s."""
    full = next((r for r in rows if r["contender"] == FULL and r["status"] == "ok"), None)
    for r in rows:
        one = r["checkpoint_bytes"] or 1
        r["disk_x_one_checkpoint"] = r["disk_bytes"] / one
        for key in ("sent_bytes", "written_bytes", "report_median_s"):
            ok = full is not None and full[key] and r[key] is not None
            r[f"{key}_ratio_to_full"] = r[key] / full[key] if ok else None  # type: ignore[index]


def run_incremental(opts: argparse.Namespace) -> dict[str, Any]:
    """The ``--incremental`` run (see the module docstring); returns the JSON report."""
    opts.data_dir = os.path.abspath(os.path.expanduser(opts.data_dir))
    os.makedirs(opts.data_dir, exist_ok=True)
    chunk = opts.chunk_mib * MiB
    total = opts.incremental_mib * MiB
    store = (opts.object_store_mb or max(512, 2 * opts.incremental_mib)) * MiB
    parent = tempfile.mkdtemp(prefix="incremental-src-", dir=opts.data_dir)
    rows = []
    try:
        sources = make_sources(parent, total)
        with ray_session(True, opts.num_cpus, store) as how:
            progress(f"{how}: storage on the driver's node, the worker on {CROSS_NODES[1]}; "
                     f"{REPORTS} reports of {total / MiB:.0f} MiB, 90% unchanged")  # fmt: skip
            node = str(ray.get_runtime_context().get_node_id())
            for contender in (FULL, INCREMENTAL):
                progress(f"{contender}: {REPORTS} reports")
                config = TransferConfig(
                    chunk_bytes=chunk, window=opts.window, incremental=contender == INCREMENTAL
                )
                rows.append(run_contender(contender, sources, node, config, opts.data_dir))
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    add_ratios(rows)
    return {
        "mode": "incremental",
        "config": {
            "checkpoint_mib": opts.incremental_mib,
            "reports": REPORTS,
            "files": FILES,
            "unchanged_fraction": (FILES - 1) / FILES,
            "chunk_mib": opts.chunk_mib,
            "full_sent_and_written": "the checkpoint per report, by construction",
        },
        "machine": machine_info(opts.data_dir),
        "results": rows,
    }


def format_incremental_table(rows: list[dict[str, Any]]) -> str:
    """Per contender: GB sent and written (and their ratio to full), disk as a
    multiple of one checkpoint, median report time."""
    head = ("contender", "sent GB", "x full", "written GB", "x full", "disk x1", "report s", "ok")
    lines = ["{:<12} {:>8} {:>7} {:>10} {:>7} {:>8} {:>9} {:>3}".format(*head)]
    for r in rows:

        def ratio(key: str, r: dict[str, Any] = r) -> str:
            value = r.get(f"{key}_ratio_to_full")
            return "-" if value is None else f"{value:.2f}"

        median = r["report_median_s"]
        lines.append(
            f"{r['contender']:<12} {r['sent_bytes'] / 1e9:>8.3f} {ratio('sent_bytes'):>7} "
            f"{r['written_bytes'] / 1e9:>10.3f} {ratio('written_bytes'):>7} "
            f"{r['disk_x_one_checkpoint']:>8.2f} "
            f"{'-' if median is None else f'{median:.2f}':>9} "
            f"{'yes' if r['status'] == 'ok' else 'NO':>3}"
        )
    return "\n".join(lines)
