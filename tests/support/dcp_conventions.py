"""What ``tests/e2e/test_dcp_conventions.py``'s Train run does in its workers and its
validation task: DCP's storage classes without a filesystem,
``air_transfer.dcp.report`` with a DCP planner and Ray's ``validation``, and the
driver's ``AIR_TRANSFER_*`` settings as a worker sees them."""

from __future__ import annotations

import os
import pickle
import threading
from typing import Any

import ray.train
import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from tests.support.dcp_fns import tensor

#: How long the report made again after a failed save may take before its worker
#: exits (it takes about a second).
RETRY_DEADLINE_S = 60.0

#: The key the planner leaves out of every save.
DROPPED = "scratch"


class DroppingPlanner(DefaultSavePlanner):
    """DCP's default planner, saving the state dict without ``DROPPED``: a
    checkpoint that lacks it was planned by this planner."""

    def set_up_planner(self, state_dict: Any, *args: Any, **kwargs: Any) -> None:
        kept = {k: v for k, v in state_dict.items() if k != DROPPED}
        super().set_up_planner(kept, *args, **kwargs)


def rank_state(rank: int, step: int) -> dict[str, Any]:
    return {f"w{rank}": tensor(10 * step + rank, (64, 64)), DROPPED: torch.ones(8), "step": step}


def conventions_loop(config: dict[str, Any]) -> None:
    """Each rank: a DCP save and load without a filesystem (the run's storage, by
    default, inside Train), then one ``air_transfer.dcp.report`` with a planner and
    ``validation=True``; the metrics say what the rank saw."""
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
    # Were the failed try counted, this report would wait for it for ever: the
    # worker exits at a deadline instead, and the run fails.
    deadline = threading.Timer(RETRY_DEADLINE_S, os._exit, args=(3,))
    deadline.start()
    try:
        air_transfer.dcp.report({"retried": True}, state_dict=state)
    finally:
        deadline.cancel()


def async_state(rank: int) -> dict[str, Any]:
    """What rank ``rank``'s async report saves (``async_report_then_overwrite``), by
    the keys DCP saves it under."""
    return {f"a{rank}": tensor(100 + rank, (64, 64)), f"m{rank}.weight": tensor(200 + rank, (4, 4))}


def async_report_then_overwrite(rank: int) -> None:
    """An ``ASYNC`` report of ``async_state(rank)``: a tensor and a module (a
    ``Stateful``, staged through its ``state_dict()``), both overwritten the moment
    the call returns, while the save may still be running. Before it, an ``ASYNC``
    report that Train refuses (a tensor among the metrics): it raises, and leaves
    no save pending for the next report to wait on for ever."""
    import air_transfer.dcp
    import air_transfer.dcp.train

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
    module = torch.nn.Linear(4, 4)
    with torch.no_grad():
        module.weight.copy_(expected[f"m{rank}.weight"])
    tensor_ = expected[f"a{rank}"].clone()
    air_transfer.dcp.report(
        {"step": 2, "refused_left_nothing_pending": refused},
        state_dict={f"a{rank}": tensor_, f"m{rank}": module, "step": 2},
        checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
    )
    with torch.no_grad():
        tensor_.fill_(-1)
        module.weight.fill_(-1)
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
