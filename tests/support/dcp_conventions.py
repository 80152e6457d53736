"""What ``tests/e2e/test_dcp_conventions.py``'s Train run does in its workers and its
validation task: DCP's storage classes without a filesystem,
``air_transfer.dcp.report`` with a DCP planner and Ray's ``validation``, a ``SYNC``
report whose save fails made again, an ``ASYNC`` report whose staging outlasts
Train's agreement, a refused ``ASYNC`` report and an ``ASYNC`` report whose state is
overwritten before its save reads it, and the driver's ``AIR_TRANSFER_*`` settings
as a worker sees them."""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import os
import pickle
import threading
from collections.abc import Iterator
from typing import Any

import ray.train
import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from tests.support.dcp_fns import tensor

#: How long a report of this run may take (about a second each) before its worker
#: exits, printing where it waits: a report waiting for ever on a failed or refused
#: one would otherwise hang the run.
REPORT_DEADLINE_S = 60.0


@contextlib.contextmanager
def deadline() -> Iterator[None]:
    """The worker exits, its threads' stacks printed, unless the block ends within
    ``REPORT_DEADLINE_S``."""
    faulthandler.dump_traceback_later(REPORT_DEADLINE_S, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


#: The key the planner leaves out of every save.
DROPPED = "scratch"


class DroppingPlanner(DefaultSavePlanner):
    """DCP's default planner, saving the state dict without ``DROPPED``: a
    checkpoint that lacks it was planned by this planner."""

    def set_up_planner(self, state_dict: Any, *args: Any, **kwargs: Any) -> None:
        kept = {k: v for k, v in state_dict.items() if k != DROPPED}
        super().set_up_planner(kept, *args, **kwargs)


class GatedPlanner(DefaultSavePlanner):
    """DCP's default planner, which plans only once ``gate`` is set: the save reads
    its state dict after the test has overwritten the caller's."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def set_up_planner(self, state_dict: Any, *args: Any, **kwargs: Any) -> None:
        if not self.gate.wait(REPORT_DEADLINE_S):
            raise TimeoutError("the save's gate was never opened")
        super().set_up_planner(state_dict, *args, **kwargs)


class Weights:
    """A ``Stateful`` holding one tensor that refuses to be deep-copied: staged, it
    must go through its ``state_dict()``."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight

    def state_dict(self) -> dict[str, Any]:
        return {"weight": self.weight}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.weight.copy_(state_dict["weight"])

    def __deepcopy__(self, memo: object) -> Weights:
        raise TypeError("Weights are staged through state_dict(), never deep-copied")


@ray.remote(num_cpus=0)
class Signal:
    """An event between the ranks' processes: ``wait`` returns once ``send`` was called."""

    def __init__(self) -> None:
        self.event = asyncio.Event()

    async def send(self) -> None:
        self.event.set()

    async def wait(self) -> None:
        await self.event.wait()


class StagedAfter:
    """A value whose staging (DCP deep-copies what is not a tensor) waits until
    ``signal`` is sent, and stages as ``STAGED``."""

    def __init__(self, signal: Any) -> None:
        self.signal = signal

    def __deepcopy__(self, memo: object) -> str:
        ray.get(self.signal.wait.remote(), timeout=REPORT_DEADLINE_S)
        return STAGED


STAGED = "staged once the other rank's report had returned"


def rank_state(rank: int, step: int) -> dict[str, Any]:
    return {f"w{rank}": tensor(10 * step + rank, (64, 64)), DROPPED: torch.ones(8), "step": step}


def conventions_loop(config: dict[str, Any]) -> None:
    """Each rank: a DCP save and load without a filesystem (the run's storage, by
    default, inside Train), then an ``air_transfer.dcp.report`` with a planner and
    ``validation=True`` (the metrics say what the rank saw), then a ``SYNC`` report
    made again after its save failed, then ``ASYNC`` reports."""
    import torch.distributed.checkpoint as dcp

    import air_transfer.dcp

    context = ray.train.get_context()
    rank = context.get_world_rank()
    run_storage = context.get_storage().storage_filesystem
    writer = air_transfer.dcp.NodeStorageWriter(config["plain_dcp_dir"])
    state = rank_state(rank, 0)
    dcp.save(state, storage_writer=writer)
    loaded = {f"w{rank}": torch.zeros(64, 64), DROPPED: torch.zeros(8), "step": -1}
    dcp.load(loaded, storage_reader=air_transfer.dcp.NodeStorageReader(config["plain_dcp_dir"]))
    from air_transfer.core import environ
    from air_transfer.observe.progress import progress_enabled

    metrics = {
        "rank": rank,
        "progress_setting": os.environ.get(environ.PROGRESS),
        "progress_on": progress_enabled(None),  # stderr is no terminal: the setting's
        "default_is_run_storage": writer.fs.filesystem == run_storage,
        "plain_dcp_round_trip": torch.equal(loaded[f"w{rank}"], state[f"w{rank}"]),
    }
    air_transfer.dcp.report(
        metrics, state_dict=rank_state(rank, 1), planner=DroppingPlanner(), validation=True
    )
    sync_report_fails_then_saves(rank)
    async_report_stages_beside_the_agreement(rank, config["signal"])
    async_report_then_overwrite(rank)


def sync_report_fails_then_saves(rank: int) -> None:
    """A ``SYNC`` report whose save fails on every rank (a value that cannot be
    pickled: DCP gathers the failure to all ranks) raises, and the same report made
    again saves and reports: the failed one did not count as a report."""
    import air_transfer.dcp

    state = {f"r{rank}": tensor(300 + rank, (8, 8)), "step": 3}
    try:
        air_transfer.dcp.report({"retried": False}, state_dict={**state, "bad": lambda: 0})
        raise AssertionError("a state dict holding a lambda was saved")
    except (AttributeError, TypeError, ValueError, pickle.PicklingError):
        pass
    with deadline():  # were the failed try counted, this one would wait on it
        air_transfer.dcp.report({"retried": True}, state_dict=state)


def async_report_stages_beside_the_agreement(rank: int, signal: Any) -> None:
    """An ``ASYNC`` report whose staging on rank 0 lasts until rank 1's report has
    returned, which takes rank 0 at Train's agreement on the checkpoint's name
    meanwhile: the staging runs beside the agreement, not before it (before it, the
    two ranks would wait on each other until the deadline)."""
    import air_transfer.dcp

    state: dict[str, Any] = {f"o{rank}": tensor(400 + rank, (8, 8)), "step": 4}
    if rank == 0:
        state["gate"] = StagedAfter(signal)
    with deadline():
        air_transfer.dcp.report(
            {"step": 4, "staged_beside": True},
            state_dict=state,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
        )
        if rank == 1:
            ray.get(signal.send.remote())
        air_transfer.dcp.wait_for_pending_save()


def async_state(rank: int) -> dict[str, Any]:
    """What rank ``rank``'s async report saves (``async_report_then_overwrite``), by
    the keys DCP saves it under."""
    return {f"a{rank}": tensor(100 + rank, (64, 64)), f"m{rank}.weight": tensor(200 + rank, (4, 4))}


def async_report_then_overwrite(rank: int) -> None:
    """An ``ASYNC`` report of ``async_state(rank)``: a tensor and a ``Stateful``'s
    weight, both overwritten as soon as the call returns and before the save reads
    anything (its planner waits for that). Before it, an ``ASYNC`` report that Train
    refuses (a tensor among the metrics): it raises, and leaves no save pending for
    the next report to wait on."""
    import air_transfer.dcp
    import air_transfer.dcp.train

    with deadline():
        try:
            air_transfer.dcp.report(
                {"loss": torch.ones(1)},
                state_dict={f"a{rank}": torch.ones(4)},
                checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
            )
            refused = False
        except ValueError:
            refused = air_transfer.dcp.train._pending is None
        expected = async_state(rank)
        weights = Weights(expected[f"m{rank}.weight"].clone())
        tensor_ = expected[f"a{rank}"].clone()
        gate = threading.Event()
        air_transfer.dcp.report(
            {"step": 2, "refused_left_nothing_pending": refused},
            state_dict={f"a{rank}": tensor_, f"m{rank}": weights, "step": 2},
            planner=GatedPlanner(gate),
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
        )
        tensor_.fill_(-1)
        weights.weight.fill_(-1)
        gate.set()
        air_transfer.dcp.wait_for_pending_save()


def validate(checkpoint: ray.train.Checkpoint) -> dict[str, Any]:
    """Ray's validation task: the reported DCP checkpoint, loaded whole here."""
    import air_transfer.dcp

    expected = {**rank_state(0, 1), **rank_state(1, 1)}
    state: dict[str, Any] = {k: torch.zeros_like(v) for k, v in expected.items() if k != "step"}
    state["step"] = -1
    del state[DROPPED]
    air_transfer.dcp.load(state, checkpoint)
    same = all(torch.equal(state[k], expected[k]) for k in ("w0", "w1"))
    return {"validated_step": state["step"], "validated_tensors": same}
