"""A Train run on a mock cluster with a worker failing right after a report, and what
every order of that failure and the report's upload allows afterwards: shared by the
end-to-end failure tests through node storage and their control on Ray's own
filesystem."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray.train
from ray.cluster_utils import Cluster
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from tests.support.checkpoints import MiB
from tests.support.cluster import shared_cluster
from tests.support.train_fns import ranked_loop

NUM_TO_KEEP = 2
#: The checkpoint of a report that must outlast a controller poll (0.2 s here): its
#: upload from another node takes 0.5-2 s on a 2-core machine. With 16 MiB the
#: other worker's failure landed while it ran in 1 run of 5, with 30 MiB in 3 of 4.
RACING_SIZE = 30 * MiB
SMALL_SIZE = 2 * MiB


def trainer_cluster() -> Iterator[Cluster]:
    """The driver's node (the storage) and two nodes that only the workers use (they
    alone offer ``trainer``): the cluster the suite shares."""
    yield shared_cluster()


def fit(tmp_path: Path, filesystem: pafs.FileSystem | None, **loop_config: Any) -> ray.train.Result:
    """Two workers, rank 0 reporting a checkpoint at steps 0, 1 and 2; one worker
    fails once right after its report of step 1."""
    (tmp_path / "returned").mkdir()
    trainer = DataParallelTrainer(
        ranked_loop,
        train_loop_config={
            "steps": 3,
            "fail_after": 1,
            "fail_marker": str(tmp_path / "failed-once"),
            "returned_dir": str(tmp_path / "returned"),
            **loop_config,
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "trainer": 1}
        ),
        run_config=ray.train.RunConfig(
            name="run",
            storage_path=str(tmp_path / "storage"),
            storage_filesystem=filesystem,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=NUM_TO_KEEP),
            failure_config=ray.train.FailureConfig(max_failures=1),
        ),
    )
    return trainer.fit()


def reported_digests(tmp_path: Path, step: int) -> dict[str, Any]:
    """The digests rank 0 reported at ``step`` of the first attempt (that report returned)."""
    return {"digests": json.loads((tmp_path / "returned" / str(step)).read_text())}


def returned_reports(tmp_path: Path) -> set[int]:
    """The steps whose report (rank 0's) returned before the failure."""
    return {int(p.name) for p in (tmp_path / "returned").iterdir()}


def assert_resumed_from_last_returned_report(result: ray.train.Result, tmp_path: Path) -> None:
    """The run restarted once: from step 1 if rank 0's report of step 1 returned
    before the failure stopped the workers, else from step 0 or 1 (registered, the
    report can still be stopped before it returns): what every order of the failure
    and the upload allows; the restarted worker (on a node other than the storage's)
    read that step's checkpoint byte for byte. Storage holds the checkpoints Train
    kept and nothing else (no orphan, no staging)."""
    assert (tmp_path / "failed-once").exists()
    returned = returned_reports(tmp_path)
    assert 0 in returned
    history = {m["step"]: m for _, m in result.best_checkpoints}
    assert sorted(history) == [1, 2]
    # The first step after the restart says which checkpoint it restored.
    resumed_from = history[1]["restored_step"]
    if resumed_from is None:  # step 1 is the first attempt's
        resumed_from = history[2]["restored_step"]
    allowed = {1} if 1 in returned else {0, 1}
    assert resumed_from in allowed, (returned, history)
    restoring = history[1] if history[1]["restored_step"] is not None else history[2]
    reported = history.get(resumed_from) or reported_digests(tmp_path, resumed_from)
    assert restoring["restored_digests"] == reported["digests"]
    experiment = tmp_path / "storage" / "run"
    on_disk = sorted(p.name for p in experiment.iterdir() if p.is_dir())
    kept = sorted(Path(c.path).name for c, _ in result.best_checkpoints)
    assert len(kept) == NUM_TO_KEEP and on_disk == kept, (on_disk, kept)
