"""PyTorch DDP with torch's Distributed Checkpoint (DCP) written straight into node
storage, resuming after a failure.

Ray's DCP recipe saves each rank's shard into a local temporary directory and
reports it; Train copies it into storage, and a restore downloads every rank's
shards onto every node. Here each rank saves its shard straight into the run's
storage (``air_transfer.storage_filesystem()``: one node's disk, reachable from
every node), the checkpoint is reported where it already is, and a restarted rank
reads only the bytes it needs:

    air_transfer.dcp.report(metrics, state_dict={"model": ..., "optim": ..., "step": step})
    air_transfer.dcp.load(state)  # False when there is no checkpoint yet

Here training fails once, right after the checkpoint of step 1 is committed; Ray
Train restarts both workers (``FailureConfig(max_failures=1)``) and they resume from
it with the model and optimizer state they had.

Run on an existing cluster (``--address auto``), or standalone: it then starts a
mock cluster on this machine (``ray.cluster_utils.Cluster``, real raylets: the
driver's node holds the storage, two more nodes the workers).

    python examples/torch_dcp.py --steps 4 --width 1024
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray
import ray.train
import torch
from ray.train.torch import TorchTrainer
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.nn.parallel import DistributedDataParallel

import air_transfer
import air_transfer.dcp

#: Custom resource of the mock cluster's worker nodes: each worker asks for one.
WORKER_NODE = "examples_dcp_worker_node"


def digest(state: Any) -> str:
    """sha256 of a state dict's tensors and values, to compare runs."""
    h = hashlib.sha256()
    for key in sorted(state):
        value = state[key]
        if isinstance(value, dict):
            h.update(digest(value).encode())
        elif isinstance(value, torch.Tensor):
            h.update(value.detach().contiguous().numpy().tobytes())
        else:
            h.update(repr(value).encode())
    return h.hexdigest()


def mlp(width: int) -> torch.nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP requires
    return torch.nn.Sequential(
        torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, 1)
    )


def train_func(config: dict[str, Any]) -> None:
    """Train an MLP with DDP and Adam; each step saves model, optimizer and step
    with DCP into the run's storage; fails once after step 1 of a fresh run."""
    width = config["width"]
    model = DistributedDataParallel(mlp(width))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    rank = ray.train.get_context().get_world_rank()
    start, resumed_from = 0, None
    if ray.train.get_checkpoint() is not None:  # restarted: resume
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "step": -1}
        air_transfer.dcp.load(state)  # this rank's part, in place
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        start = resumed_from = state["step"] + 1
    for step in range(start, config["steps"]):
        x = torch.randn(64, width, generator=torch.Generator().manual_seed(1000 * step + rank))
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        metrics = {
            "step": step,
            "resumed_from": resumed_from,
            "digest": digest({"model": model_sd, "optim": optim_sd}),
            "model_digest": digest(model_sd),
            "node": ray.get_runtime_context().get_node_id(),
        }
        # Every rank saves its part; returns once the checkpoint is in storage.
        state = {"model": model_sd, "optim": optim_sd, "step": step}
        air_transfer.dcp.report(metrics, state_dict=state)
        if resumed_from is None and step == 1:
            ray.train.get_all_reported_checkpoints(  # let Train commit it first
                consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
            )
            raise RuntimeError("simulated crash after the checkpoint of step 1")


def fit(storage_path: str, steps: int, width: int, name: str) -> ray.train.Result:
    on_worker_nodes = WORKER_NODE in ray.cluster_resources()
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"steps": steps, "width": width},
        scaling_config=ray.train.ScalingConfig(
            num_workers=2,
            # On the mock cluster: one worker on each node that is not the driver's.
            resources_per_worker={"CPU": 1, WORKER_NODE: 1} if on_worker_nodes else None,
        ),
        run_config=air_transfer.run_config(
            root=storage_path,  # a directory on the driver's node
            name=name,
            failure_config=ray.train.FailureConfig(max_failures=1),
        ),
    )
    return trainer.fit()


def main(
    steps: int = 4,
    width: int = 1024,
    address: str | None = None,
    storage_path: str | None = None,
) -> dict[str, Any]:
    """Train with a failure and a resume; returns the last report, which node the
    workers and the storage were on, the files of the last checkpoint, and whether
    the last checkpoint loads on the driver with the digest the workers reported.

    Uses the Ray this process is connected to, else the cluster at ``address``,
    else a mock cluster it starts and stops. ``storage_path`` defaults to a
    temporary directory, removed at the end.
    """
    cluster = None
    if not ray.is_initialized():
        if address is None:
            from ray.cluster_utils import Cluster

            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
            for _ in range(2):
                cluster.add_node(num_cpus=1, resources={WORKER_NODE: 1})
            cluster.wait_for_nodes()
            address = cluster.address
        ray.init(address=address)
    storage = storage_path or tempfile.mkdtemp(prefix="dcp-storage-")
    try:
        result = fit(storage, steps, width, "torch-dcp")  # raises if training failed
        if result.checkpoint is None:
            raise RuntimeError("the run reported no checkpoint")
        # The driver loads the model and the step (one process, no process group).
        state = {"model": mlp(width).state_dict(), "step": -1}
        air_transfer.dcp.load(state, result.checkpoint)
        files = result.checkpoint.filesystem.get_file_info(
            pafs.FileSelector(result.checkpoint.path)
        )
        return {
            **result.metrics,
            "checkpoint_path": result.checkpoint.path,
            "checkpoint_files": sorted(Path(f.path).name for f in files),
            "loaded_step": state["step"],
            "loaded_model_matches": digest(state["model"]) == result.metrics["model_digest"],
            "driver_node": ray.get_runtime_context().get_node_id(),
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
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--width", type=int, default=1024, help="the MLP's hidden width")
    parser.add_argument("--address", default=None, help="a Ray cluster (default: start one)")
    parser.add_argument("--storage", default=None, help="storage directory on the driver node")
    args = parser.parse_args()
    print(json.dumps(main(args.steps, args.width, args.address, args.storage), indent=2))
