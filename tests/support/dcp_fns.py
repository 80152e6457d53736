"""What the DCP tests run on other nodes: ``Rank``, an actor that joins a gloo
process group of any size (one process per rank, as Train's workers are), and the
state dicts the ranks save and load, built the same way on every rank from a seed."""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
import ray.train
import torch
import torch.distributed as dist

MiB = 1024 * 1024


@ray.remote(num_cpus=0)
class Rank:
    """One rank of a gang; ``run`` calls a function in it (inside the group, if set)."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def join(self, rank: int, world: int, port: int) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()

    def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gang(ranks: list[Any], fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``fn(rank, world, *args)`` on each of ``ranks`` at once, in one process group
    of their number; what each returned."""
    port = free_port()
    world = len(ranks)
    ray.get([r.join.remote(i, world, port) for i, r in enumerate(ranks)])
    try:
        return ray.get([r.run.remote(fn, i, world, *args) for i, r in enumerate(ranks)])
    finally:
        ray.get([r.leave.remote() for r in ranks])


def tensor(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g)


def owned(rank: int, mib: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s own tensors (hand-sharded: no other rank has them), ``mib``
    MiB in four tensors."""
    rows = mib * MiB // (4 * 4 * 1024)
    return {f"rank{rank}.part{i}": tensor(100 * rank + i, (rows, 1024)) for i in range(4)}


def sharded_state(rank: int, mib: int) -> dict[str, Any]:
    """What rank ``rank`` saves: its own tensors, one replicated tensor (the same on
    every rank: DCP stores it once) and a plain value."""
    return {**owned(rank, mib), "replicated": tensor(7, (256, 1024)), "step": 5}


def zeroed(state: dict[str, Any]) -> dict[str, Any]:
    return {
        k: torch.zeros_like(v) if isinstance(v, torch.Tensor) else None for k, v in state.items()
    }


def pid() -> int:
    return os.getpid()


# -- Ray Train loops --------------------------------------------------------------------
def digest(state: Any) -> str:
    """sha256 of every leaf of a (nested) state dict, tensors by their bytes."""
    h = hashlib.sha256()

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k in sorted(value, key=str):
                walk(f"{prefix}.{k}", value[k])
        elif isinstance(value, (list, tuple)):
            for i, v in enumerate(value):
                walk(f"{prefix}[{i}]", v)
        elif isinstance(value, torch.Tensor):
            h.update(prefix.encode())
            h.update(value.detach().contiguous().numpy().tobytes())
        else:
            h.update(f"{prefix}={value!r}".encode())

    walk("", state)
    return h.hexdigest()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)  # every rank starts from the same weights, as DDP requires
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 256)
    )  # 2 MiB of weights, 6 MiB with Adam's state


def _fail_once(config: dict[str, Any], step: int) -> None:
    """The planned failure: every rank fails after reporting ``fail_after``, once
    Train has committed that report (so the resume point is known)."""
    marker = f"{config.get('fail_marker')}.{ray.train.get_context().get_world_rank()}"
    if config.get("fail_after") == step and not os.path.exists(marker):
        _committed()
        Path(marker).write_text("failed once")
        raise RuntimeError(f"injected failure after step {step}")


class Unsaveable:
    """A value whose ``torch.save`` fails: the rank saving it fails midway through
    its save (its shard's upload open), as a rank that dies there."""

    def __reduce__(self) -> Any:
        raise RuntimeError("injected failure while saving")


class Unstageable:
    """A value that cannot be deep-copied: the rank staging it for an ``ASYNC``
    report fails in its staging, which runs while Train agrees on the report."""

    def __deepcopy__(self, memo: object) -> Unstageable:
        raise TypeError("injected failure while staging")


def _failing_save(config: dict[str, Any], step: int) -> dict[str, Any]:
    """What rank 1 adds to its state at step ``fail_in_save``, once: ``Unsaveable``;
    at step ``fail_in_staging``, once, ``Unstageable``, the step before committed
    first (so the resume point is known)."""
    rank = ray.train.get_context().get_world_rank()
    for key, value in (("save", Unsaveable), ("staging", Unstageable)):
        marker = f"{config.get('fail_marker')}.{key}"
        if config.get(f"fail_in_{key}") == step and rank == 1 and not os.path.exists(marker):
            if key == "staging":
                _committed()
            Path(marker).write_text("failed once")
            return {"injected": value()}
    return {}


def _committed() -> None:
    """Wait until every report made so far is complete and committed by Train."""
    import air_transfer.dcp

    air_transfer.dcp.wait_for_pending_save()
    ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
    )


def dcp_train_loop(config: dict[str, Any]) -> None:
    """DDP training of a small MLP with Adam; every step DCP-saves the model, the
    optimizer and the step through ``air_transfer.dcp.report``; a restarted run
    resumes from the latest checkpoint with ``air_transfer.dcp.load``. A failure
    planned after a report (``fail_after``), inside rank 1's save (``fail_in_save``)
    or in its staging of an ``ASYNC`` report (``fail_in_staging``)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.nn.parallel import DistributedDataParallel

    import air_transfer.dcp

    model = DistributedDataParallel(_model())
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    rank = ray.train.get_context().get_world_rank()
    start, restored = 0, {}
    if ray.train.get_checkpoint() is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state = {"model": model_sd, "optim": optim_sd, "step": -1}
        assert air_transfer.dcp.load(state)
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
        model_sd, optim_sd = get_state_dict(model, optimizer)
        start = state["step"] + 1
        mine = digest([model_sd, optim_sd])
        everyone: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, mine)
        restored = {"restored_step": state["step"], "restored_digests": everyone}
    for step in range(start, config["steps"]):
        x = tensor(1000 * step + rank, (32, 256))
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
        model_sd, optim_sd = get_state_dict(model, optimizer)
        metrics = {
            "step": step,
            "digest": digest([model_sd, optim_sd]),
            "node": ray.get_runtime_context().get_node_id(),
            **restored,
        }
        air_transfer.dcp.report(
            metrics,
            state_dict={
                "model": model_sd,
                "optim": optim_sd,
                "step": step,
                **_failing_save(config, step),
            },
            checkpoint_upload_mode=config.get("upload_mode", ray.train.CheckpointUploadMode.SYNC),
        )
        restored = {}
        _fail_once(config, step)


def torch_save_loop(config: dict[str, Any]) -> None:
    """The usual recipe, unchanged: rank 0 ``torch.save``s ``model.pt`` into a
    directory it reports (Train uploads it into the run's storage); a restarted run
    restores it on every rank."""
    import tempfile

    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = ray.train.get_context().get_world_rank()
    checkpoint, start, restored = ray.train.get_checkpoint(), 0, {}
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            saved = torch.load(Path(d, "model.pt"), weights_only=True)
        model.module.load_state_dict(saved["model"])
        start = saved["step"] + 1
        restored = {"restored_step": saved["step"], "restored_digests": _gathered(model)}
    for step in range(start, config["steps"]):
        optimizer.zero_grad()
        model(tensor(1000 * step + rank, (8, 256))).pow(2).mean().backward()
        optimizer.step()
        metrics = {"step": step, "digest": digest(model.module.state_dict()), **restored}
        with tempfile.TemporaryDirectory() as d:
            checkpoint = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "step": step}, Path(d, "model.pt"))
                checkpoint = ray.train.Checkpoint.from_directory(d)
            ray.train.report(metrics, checkpoint=checkpoint)
        restored = {}
        _fail_once(config, step)


def _gathered(model: Any) -> list[str]:
    """Every rank's digest of its model, gathered on every rank (rank 0's metrics are
    the ones Train keeps)."""
    mine = digest(model.module.state_dict())
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone
