"""``air_transfer.dcp`` as Ray Train and torch DCP users know them, in one
TorchTrainer run on the shared mock cluster (2 workers on the two nodes that are not
the driver's, the run's storage on the driver's node):

- ``NodeStorageWriter(path)`` / ``NodeStorageReader(path)`` without a filesystem
  use the run's storage in a Train worker (they used node storage of the worker's
  own node: the ranks' shards scattered over two disks);
- ``air_transfer.dcp.report(metrics, state_dict=..., planner=..., validation=True)``:
  ``ray.train.report``'s order, DCP's planner used for the save, Ray's validation
  run on the reported checkpoint;
- a setting made on the driver (``AIR_TRANSFER_PROGRESS``) is in force in the
  workers (Ray Train copied only its own variables to them).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray.train
from ray.train import ValidationConfig
from ray.train.torch import TorchTrainer

import air_transfer
from air_transfer.core import environ
from air_transfer.dcp import NodeStorageReader
from tests.support.cluster import shared_cluster
from tests.support.dcp_conventions import DROPPED, conventions_loop, validate


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ray.train.Result, Path]]:
    """The run, with ``AIR_TRANSFER_PROGRESS=1`` set on the driver; the agents that
    it started with it are shut down after (the next module's start without it)."""
    shared_cluster()
    storage = tmp_path_factory.mktemp("storage")
    trainer = TorchTrainer(
        conventions_loop,
        train_loop_config={"plain_dcp_dir": str(storage / "plain-dcp")},
        scaling_config=ray.train.ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "trainer": 1}
        ),
        run_config=ray.train.RunConfig(
            name="conventions",
            storage_path=str(storage),
            storage_filesystem=air_transfer.storage_filesystem(),
        ),
        validation_config=ValidationConfig(fn=validate, ray_remote_kwargs={"num_cpus": 0}),
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv(environ.PROGRESS, "1")
        result = trainer.fit()
    yield result, storage
    air_transfer.shutdown_agents()


def test_a_setting_made_on_the_driver_is_in_force_in_every_worker(
    run: tuple[ray.train.Result, Path],
) -> None:
    result, _ = run
    [(_, metrics)] = result.best_checkpoints  # rank 0's (Train keeps those)
    assert metrics["progress_setting"] == "1" and metrics["progress_on"] is True


def test_dcp_storage_without_a_filesystem_is_the_runs_storage_in_train(
    run: tuple[ray.train.Result, Path],
) -> None:
    """Both ranks' plain ``dcp.save`` landed in one directory on the driver's node,
    and each loaded its part back, with no filesystem passed."""
    result, storage = run
    [(_, metrics)] = result.best_checkpoints
    assert metrics["default_is_run_storage"] and metrics["plain_dcp_round_trip"]
    names = {p.name for p in (storage / "plain-dcp").iterdir()}
    assert names == {".metadata", "__0_0.distcp", "__1_0.distcp"}


def test_report_saves_with_the_planner_and_ray_validates_the_checkpoint(
    run: tuple[ray.train.Result, Path],
) -> None:
    result, _ = run
    [(checkpoint, metrics)] = result.best_checkpoints
    reader: Any = NodeStorageReader(checkpoint.path, checkpoint.filesystem)
    saved = set(reader.read_metadata().state_dict_metadata)
    assert saved == {"w0", "w1", "step"}  # the planner left DROPPED out
    assert DROPPED not in saved
    assert metrics["validated_step"] == 1 and metrics["validated_tensors"] is True
