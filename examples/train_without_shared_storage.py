"""Multi-node Ray Train with no shared storage, resuming after a failure.

Since Ray 2.7 every node must reach ``RunConfig(storage_path)``: an NFS mount or a
cloud bucket. ``air_transfer.storage_filesystem()`` is a pyarrow filesystem whose files
live on one node's disk (the driver's, by default) and that every node reaches
through the Ray cluster, in chunks. Workers report checkpoints as usual; they land on
that disk, and ``ray.train.get_checkpoint()`` brings the latest back to whichever
node a restarted worker runs on.

Here the training function fails once, right after its first checkpoint; Ray Train
restarts it (``FailureConfig(max_failures=1)``) and it resumes from that checkpoint.

Run on an existing cluster (``--address auto``), or standalone: it then starts a
two-node mock cluster on this machine (``ray.cluster_utils.Cluster``, real raylets)
and places the workers on the node that is not the driver's.

    python examples/train_without_shared_storage.py --epochs 3 --size-mb 64
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

import air_transfer

MiB = 1024 * 1024
#: Custom resource of the mock cluster's second node: the workers ask for a bit of it.
WORKER_NODE = "examples_worker_node"


def train_func(config: dict[str, Any]) -> None:
    """Each epoch writes the weights and the epoch number and reports them; fails
    once, after the first checkpoint of a run that did not resume."""
    start, resumed_from = 0, None
    checkpoint = ray.train.get_checkpoint()  # the latest reported one, if restarted
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            resumed_from = json.loads(Path(d, "state.json").read_text())["epoch"]
        start = resumed_from + 1
    for epoch in range(start, config["epochs"]):
        weights = np.random.default_rng(epoch).random(config["size_bytes"] // 4, np.float32)
        with tempfile.TemporaryDirectory() as d:
            weights.tofile(Path(d, "weights.bin"))
            Path(d, "state.json").write_text(json.dumps({"epoch": epoch}))
            metrics = {
                "epoch": epoch,
                "resumed_from": resumed_from,
                "sha256": hashlib.sha256(weights.tobytes()).hexdigest(),
                "node": ray.get_runtime_context().get_node_id(),
            }
            # Returns once the checkpoint is on the storage node's disk and Train
            # has registered it: a failure from here on resumes from it.
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))
        if checkpoint is None and epoch == 0:
            raise RuntimeError("simulated crash after the first checkpoint")


def fit(storage_path: str, epochs: int, size_bytes: int, chunk_bytes: int) -> ray.train.Result:
    """One training run whose storage is the driver node's disk."""
    on_worker_node = WORKER_NODE in ray.cluster_resources()
    trainer = DataParallelTrainer(
        train_func,
        train_loop_config={"epochs": epochs, "size_bytes": size_bytes},
        scaling_config=ray.train.ScalingConfig(
            num_workers=1,
            # On the mock cluster, keep the worker off the driver's node.
            resources_per_worker={"CPU": 1, WORKER_NODE: 0.01} if on_worker_node else None,
        ),
        run_config=air_transfer.run_config(
            root=storage_path,  # a directory on the driver node
            config=air_transfer.TransferConfig(chunk_bytes=chunk_bytes),
            name="no-shared-storage",
            failure_config=ray.train.FailureConfig(max_failures=1),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    )
    return trainer.fit()


def main(
    epochs: int = 3,
    size_bytes: int = 64 * MiB,
    chunk_bytes: int = 32 * MiB,
    address: str | None = None,
    storage_path: str | None = None,
) -> dict[str, Any]:
    """Train with a failure and a resume; returns what the last report said, where
    the workers and the storage were, and whether the final checkpoint restores on
    the driver with the bytes the worker wrote.

    Uses the Ray this process is connected to, else the cluster at ``address``, else
    a two-node mock cluster it starts and stops. ``storage_path`` defaults to a
    temporary directory, removed at the end.
    """
    cluster = None
    if not ray.is_initialized():
        if address is None:
            from ray.cluster_utils import Cluster

            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
            cluster.add_node(num_cpus=1, resources={WORKER_NODE: 1})
            cluster.wait_for_nodes()
            address = cluster.address
        ray.init(address=address)
    storage = storage_path or tempfile.mkdtemp(prefix="train-storage-")
    try:
        result = fit(storage, epochs, size_bytes, chunk_bytes)  # raises if training failed
        if result.checkpoint is None:
            raise RuntimeError("the run reported no checkpoint")
        with result.checkpoint.as_directory() as d:  # on the driver's node
            restored = hashlib.sha256(Path(d, "weights.bin").read_bytes()).hexdigest()
        return {
            **result.metrics,
            "restored_on_driver_matches": restored == result.metrics["sha256"],
            "driver_node": ray.get_runtime_context().get_node_id(),
            "checkpoint_path": result.checkpoint.path,
        }
    finally:
        if storage_path is None:
            shutil.rmtree(storage, ignore_errors=True)
        if cluster is not None:
            ray.shutdown()
            cluster.shutdown()
        elif address is not None:
            ray.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=64)
    parser.add_argument("--chunk-mb", type=int, default=32)
    parser.add_argument("--address", default=None, help="a Ray cluster (default: start one)")
    parser.add_argument("--storage", default=None, help="storage directory on the driver node")
    args = parser.parse_args()
    out = main(args.epochs, args.size_mb * MiB, args.chunk_mb * MiB, args.address, args.storage)
    print(json.dumps(out, indent=2))
