"""Ray Train on a mock cluster, storage on the driver's node, two workers on two
other nodes, and a worker failing right after a report: the restarted run resumes
from the checkpoint of the last report that returned, and storage holds exactly the
checkpoints Train keeps (``num_to_keep``), as with Ray's own local filesystem.

Train registers a checkpoint only once every worker's report of that round reached
its controller; a worker failing while another one's upload still runs stops the
round (ray-project/ray#41700), and the storage node's agent used to finish that
upload anyway, leaving a checkpoint nobody tracks.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from ray.cluster_utils import Cluster

import air_transfer
from tests.support.incremental_train import (
    INCREMENTAL,
    MOST_SENT,
    assert_kept_whole,
    fit_frozen,
    sent_to_head,
)
from tests.support.train_failures import (
    RACING_SIZE,
    SMALL_SIZE,
    assert_resumed_from_last_returned_report,
    fit,
    returned_reports,
    trainer_cluster,
)


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[Cluster]:
    yield from trainer_cluster()


@pytest.fixture(scope="module")
def fs(tmp_path_factory: pytest.TempPathFactory) -> pafs.FileSystem:
    """Node storage on the head node, rooted at the session's temporary directory."""
    return air_transfer.storage_filesystem(root=str(tmp_path_factory.getbasetemp()))


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_failure_right_after_the_reporting_workers_report_resumes_from_it(
    tmp_path: Path, fs: pafs.FileSystem, mode: str
) -> None:
    """The worker that reports the checkpoint fails right after its report of step 1
    (``ASYNC``: once Train registered it): the run resumes from step 1, and storage
    keeps ``num_to_keep`` checkpoints, through node storage as with Ray's own
    local filesystem (``test_train_failures_ray_local.py``)."""
    result = fit(tmp_path, fs, fail_rank=0, mode=mode, size=SMALL_SIZE)
    assert 1 in returned_reports(tmp_path)
    assert_resumed_from_last_returned_report(result, tmp_path)


@pytest.mark.parametrize("mode", ["SYNC", "ASYNC"])
def test_a_checkpoint_reported_just_before_a_worker_failure_is_not_orphaned(
    tmp_path: Path, fs: pafs.FileSystem, mode: str
) -> None:
    """A checkpoint reported just before a worker failure was orphaned, and the run
    resumed from an older one: the worker without a checkpoint fails right after
    its report of step 1 while rank 0's upload still runs; Train stops the round,
    the storage node's agent finished the upload anyway (3 checkpoints stored where
    ``num_to_keep=2``), and a report that returned could still be followed by a
    restore of the step before. Now the run resumes from the last of rank 0's
    reports that returned, and storage holds only what Train tracks. (Ray's own
    local filesystem leaves such a checkpoint too: ray-project/ray#41700.)"""
    result = fit(tmp_path, fs, fail_rank=1, mode=mode, size=RACING_SIZE)
    assert_resumed_from_last_returned_report(result, tmp_path)


def test_incremental_reports_send_what_changed_and_restore_whole(tmp_path: Path) -> None:
    """With ``incremental=True`` a worker's reports share a frozen file: only the
    changed bytes travel, Train's pruning leaves the kept checkpoints whole, and the
    restarted worker restores the last one bit-identical."""
    before = sent_to_head()
    marker = tmp_path / "failed-once"
    fs = air_transfer.storage_filesystem(config=INCREMENTAL, root=str(tmp_path))
    result = fit_frozen(tmp_path, "incremental", fs, fail_after=0, fail_marker=str(marker))
    assert marker.exists()
    assert_kept_whole(result)
    resumed = {m["step"]: m for _, m in result.best_checkpoints}[1]
    assert resumed["restored_step"] == 0 and resumed["restored_digests"]
    assert sent_to_head() - before <= MOST_SENT
