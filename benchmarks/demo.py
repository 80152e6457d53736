"""``python -m benchmarks demo``: Ray Train with no shared storage, end to end.

Starts an embedded two-node mock cluster (``ray.cluster_utils.Cluster``: real raylets
on this machine), runs a ``DataParallelTrainer`` whose workers sit on the non-driver
node and report checkpoints, with ``air_transfer.run_config(root=...)`` (node storage)
so they land on the driver node's disk; then restores the last one on the driver and
on the worker node, checking the bytes. Prints where each checkpoint landed and how
long each transfer took.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import TransferConfig, run_config
from benchmarks.cliargs import positive_int
from benchmarks.units import MiB

WORKER_NODE = "air_transfer_demo_workers"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``demo`` subcommand's flags."""
    parser.add_argument(
        "--size-mb", type=positive_int, default=256, metavar="MB",
        help="bytes of each checkpoint, all workers together (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--reports", type=positive_int, default=3,
        help="checkpoints reported (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--workers", type=positive_int, default=2,
        help="training workers, all on the non-driver node (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-mb", type=positive_int, default=32, metavar="MB",
        help="chunk size of the transfers (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--storage", default=None, metavar="DIR",
        help="storage path on the driver node (default: a temporary directory, removed "
        "at the end)",
    )  # fmt: skip
    parser.set_defaults(run=run)


def _train_loop(config: dict[str, Any]) -> None:
    """Each worker writes its shard of every checkpoint and times the report (SYNC:
    it returns once the files are stored on the driver node)."""
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    shard = config["size"] // world
    for step in range(config["reports"]):
        d = Path(tempfile.mkdtemp(prefix="demo-ckpt-"))
        with open(d / f"model-rank{rank}.bin", "wb") as f:
            for left in range(shard, 0, -16 * MiB):
                f.write(os.urandom(min(left, 16 * MiB)))
        digests = _digests(d)
        start = time.perf_counter()
        ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(d))
        seconds = time.perf_counter() - start
        shutil.rmtree(d)
        path = ray.train.get_checkpoint().path
        if rank == 0:
            node = ray.get_runtime_context().get_node_id()
            record = {"step": step, "path": path, "seconds": seconds, "digests": digests}
            ray.get(config["log"].add.remote({**record, "node": node, "world": world}))


class _Log:
    """Where rank 0 records each transfer (metrics without a checkpoint are not kept)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def add(self, record: dict[str, Any]) -> None:
        self.records.append(record)

    def get(self) -> list[dict[str, Any]]:
        return self.records


def _digests(root: str | Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``."""
    out = {}
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(4 * MiB):
                h.update(block)
        out[path.relative_to(root).as_posix()] = h.hexdigest()
    return out


def _restore_on_worker_node(checkpoint: ray.train.Checkpoint) -> tuple[float, dict[str, str], str]:
    target = tempfile.mkdtemp(prefix="demo-restore-")
    start = time.perf_counter()
    checkpoint.to_directory(target)
    seconds = time.perf_counter() - start
    try:
        return seconds, _digests(target), ray.get_runtime_context().get_node_id()
    finally:
        shutil.rmtree(target)


def run(opts: argparse.Namespace) -> int:
    from ray.cluster_utils import Cluster

    size = opts.size_mb * MiB
    storage = Path(opts.storage or tempfile.mkdtemp(prefix="air-transfer-demo-")).absolute()
    store_bytes = max(256 * MiB, 8 * opts.chunk_mb * MiB)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "object_store_memory": store_bytes,
            "include_dashboard": False,
        },
    )
    cluster.add_node(
        num_cpus=opts.workers,
        resources={WORKER_NODE: opts.workers},
        object_store_memory=store_bytes,
    )
    try:
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, logging_level=logging.ERROR, log_to_driver=False)
        return _demo(opts, size, storage)
    finally:
        ray.shutdown()
        cluster.shutdown()
        if opts.storage is None:
            shutil.rmtree(storage, ignore_errors=True)


def _demo(opts: argparse.Namespace, size: int, storage: Path) -> int:
    driver = ray.get_runtime_context().get_node_id()
    config = run_config(
        root=str(storage),
        config=TransferConfig(chunk_bytes=opts.chunk_mb * MiB),
        name="demo",
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
    )
    log: Any = ray.remote(num_cpus=0)(_Log).remote()
    print(f"storage: {storage} on the driver node {driver[:12]}")
    trainer = DataParallelTrainer(
        _train_loop,
        train_loop_config={"size": size, "reports": opts.reports, "log": log},
        scaling_config=ray.train.ScalingConfig(
            num_workers=opts.workers, resources_per_worker={"CPU": 1, WORKER_NODE: 1}
        ),
        run_config=config,
    )
    result = trainer.fit()
    transfers = ray.get(log.get.remote())
    print(
        f"{transfers[0]['world']} workers on node {transfers[0]['node'][:12]} reported "
        f"{opts.reports} checkpoints of {size / MiB:.0f} MiB (num_to_keep=2):"
    )
    for t in transfers:
        on_disk = Path(t["path"])
        kept = on_disk.is_dir()
        where = f"{on_disk}" if kept else f"{on_disk.name} (deleted: num_to_keep)"
        print(
            f"  step {t['step']}: upload {t['seconds']:6.2f} s "
            f"({size / MiB / t['seconds']:7.1f} MiB/s)  -> {where}"
        )
    # What rank 0 wrote (its metrics are the ones kept) is what landed, and what
    # every restore gives back.
    last = transfers[-1]
    landed = _digests(last["path"])
    ok = all(landed.get(name) == sha for name, sha in last["digests"].items())
    start = time.perf_counter()
    checkpoint = result.checkpoint
    if checkpoint is None:
        print("MISMATCH: the run reported no checkpoint")
        return 1
    local = checkpoint.to_directory(tempfile.mkdtemp(prefix="demo-restore-"))
    seconds = time.perf_counter() - start
    print(f"  restore on the driver node {driver[:12]}: {seconds:6.2f} s  -> {local}")
    ok &= _digests(local) == landed
    shutil.rmtree(local)
    seconds, remote, node = ray.get(
        ray.remote(num_cpus=0, resources={WORKER_NODE: 0.01})(_restore_on_worker_node).remote(
            checkpoint
        )
    )
    print(f"  restore on the worker node {node[:12]}: {seconds:6.2f} s")
    ok &= remote == landed
    print("bytes identical everywhere" if ok else "MISMATCH: restored bytes differ")
    return 0 if ok else 1
