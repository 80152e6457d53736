"""``air_transfer.dcp`` as Ray Train and torch DCP users know them, in one
TorchTrainer run on the shared mock cluster (2 workers on the two nodes that are not
the driver's, the run's storage on the driver's node):

- ``NodeStorageWriter(path)`` / ``NodeStorageReader(path)`` without a filesystem
  use the run's storage in a Train worker (they used node storage of the worker's
  own node: the ranks' shards scattered over two disks);
- ``air_transfer.dcp.report(metrics, state_dict=..., planner=..., validation=True)``:
  ``ray.train.report``'s order, DCP's planner used for the save, Ray's validation
  run on the reported checkpoint;
- ``air_transfer.dcp.report(..., checkpoint_upload_mode=ASYNC)`` returns once the
  state is staged: what it held then is saved, whatever changes after; it stages
  while Train agrees on the checkpoint's name, not before;
- a setting made on the driver (``AIR_TRANSFER_PROGRESS``) is in force in the
  workers (Ray Train copied only its own variables to them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray.train
import torch
from ray.train import ValidationConfig
from ray.train.torch import TorchTrainer

import air_transfer
import air_transfer.dcp
from air_transfer.core import environ
from air_transfer.dcp import NodeStorageReader
from tests.support.cluster import shared_cluster
from tests.support.dcp_conventions import (
    DROPPED,
    STAGED,
    Signal,
    async_state,
    conventions_loop,
    validate,
)
from tests.support.dcp_fns import tensor


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ray.train.Result, Path]]:
    """The run, with ``AIR_TRANSFER_PROGRESS=1`` set on the driver; the agents that
    it started with it are shut down after (the next module's start without it)."""
    shared_cluster()
    storage = tmp_path_factory.mktemp("storage")
    trainer = TorchTrainer(
        conventions_loop,
        train_loop_config={"plain_dcp_dir": str(storage / "plain-dcp"), "signal": Signal.remote()},
        scaling_config=ray.train.ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "trainer": 1}
        ),
        run_config=ray.train.RunConfig(
            name="conventions",
            storage_path=str(storage),
            storage_filesystem=air_transfer.storage_filesystem(root=str(storage)),
        ),
        validation_config=ValidationConfig(fn=validate, ray_remote_kwargs={"num_cpus": 0}),
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv(environ.PROGRESS, "1")
        result = trainer.fit()
    yield result, storage
    air_transfer.shutdown_agents()


def first_report(result: ray.train.Result) -> tuple[ray.train.Checkpoint, dict[str, Any]]:
    """The checkpoint and metrics of the run's first ``air_transfer.dcp.report``
    (rank 0's, as Train keeps them); a retried one and an async one follow."""
    firsts = [(c, m) for c, m in result.best_checkpoints if "progress_setting" in m]
    assert len(firsts) == 1, result.best_checkpoints
    return firsts[0]


def test_a_setting_made_on_the_driver_is_in_force_in_every_worker(
    run: tuple[ray.train.Result, Path],
) -> None:
    _, metrics = first_report(run[0])
    assert metrics["progress_setting"] == "1" and metrics["progress_on"] is True


def test_dcp_storage_without_a_filesystem_is_the_runs_storage_in_train(
    run: tuple[ray.train.Result, Path],
) -> None:
    """Both ranks' plain ``dcp.save`` landed in one directory on the driver's node,
    and each loaded its part back, with no filesystem passed."""
    result, storage = run
    _, metrics = first_report(result)
    assert metrics["default_is_run_storage"] and metrics["plain_dcp_round_trip"]
    names = {p.name for p in (storage / "plain-dcp").iterdir()}
    assert names == {".metadata", "__0_0.distcp", "__1_0.distcp"}


def test_report_saves_with_the_planner_and_ray_validates_the_checkpoint(
    run: tuple[ray.train.Result, Path],
) -> None:
    checkpoint, metrics = first_report(run[0])
    reader: Any = NodeStorageReader(checkpoint.path, checkpoint.filesystem)
    saved = set(reader.read_metadata().state_dict_metadata)
    assert saved == {"w0", "w1", "step"}  # the planner left DROPPED out
    assert DROPPED not in saved
    assert metrics["validated_step"] == 1 and metrics["validated_tensors"] is True


def test_an_async_report_saves_the_state_as_it_was_when_the_call_returned(
    run: tuple[ray.train.Result, Path],
) -> None:
    """Each rank overwrote its tensor and its ``Stateful``'s weight as soon as the
    ``ASYNC`` report returned, before the save read anything (its planner waited for
    that); the checkpoint, loaded here, holds the values from before.
    A refused ``ASYNC`` report before it left no save pending."""
    result, _ = run
    assert result.checkpoint is not None and result.metrics["step"] == 2
    assert result.metrics["refused_left_nothing_pending"] is True
    expected = {**async_state(0), **async_state(1)}
    loaded: dict[str, Any] = {k: torch.zeros_like(v) for k, v in expected.items()}
    loaded["step"] = -1
    air_transfer.dcp.load(loaded, result.checkpoint)
    assert loaded.pop("step") == 2
    for key, value in expected.items():
        assert torch.equal(loaded[key], value), f"{key} holds what was written after the call"


def test_an_async_report_stages_while_train_agrees_on_the_checkpoints_name(
    run: tuple[ray.train.Result, Path],
) -> None:
    """Rank 0's staging waited until rank 1's report had returned, which took rank
    0 at Train's agreement while it staged: the report completed, and its
    checkpoint holds both ranks' tensors and what rank 0 staged."""
    result, _ = run
    [(checkpoint, _)] = [(c, m) for c, m in result.best_checkpoints if m.get("staged_beside")]
    loaded: dict[str, Any] = {"o0": torch.zeros(8, 8), "o1": torch.zeros(8, 8), "gate": ""}
    loaded["step"] = -1
    air_transfer.dcp.load(loaded, checkpoint)
    assert loaded["step"] == 4 and loaded["gate"] == STAGED
    assert torch.equal(loaded["o0"], tensor(400, (8, 8)))
    assert torch.equal(loaded["o1"], tensor(401, (8, 8)))


def test_a_sync_report_whose_save_failed_can_be_made_again(
    run: tuple[ray.train.Result, Path],
) -> None:
    """Each rank's first try raised (the state held a lambda), and the same report
    made again is the run's second checkpoint, whole: the failed try left Train's
    count of reports as it was (the run would otherwise wait on it for ever)."""
    result, _ = run
    reports = [m for _, m in result.best_checkpoints]
    assert [m.get("retried") for m in reports] == [None, True, None, None]
    [retried] = [c for c, m in result.best_checkpoints if m.get("retried")]
    loaded: dict[str, Any] = {"r0": torch.zeros(8, 8), "r1": torch.zeros(8, 8), "step": -1}
    air_transfer.dcp.load(loaded, retried)
    assert loaded["step"] == 3
    assert torch.equal(loaded["r0"], tensor(300, (8, 8)))
    assert torch.equal(loaded["r1"], tensor(301, (8, 8)))


def test_the_runs_storage_holds_only_the_checkpoints_train_tracks(
    run: tuple[ray.train.Result, Path],
) -> None:
    """Neither the failed ``SYNC`` save nor the refused ``ASYNC`` report left a
    checkpoint directory behind (Ray Train's contract: nothing it does not track
    stays in storage): each checkpoint directory in the run's storage is one Train
    tracks."""
    result, storage = run
    tracked = {Path(c.path).name for c, _ in result.best_checkpoints}
    stored = {p.name for p in (storage / "conventions").glob("checkpoint_*") if p.is_dir()}
    assert len(tracked) == 4 and stored == tracked
