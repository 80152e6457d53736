"""The control of ``test_train_failures.py``: the same run on Ray's own local
filesystem (the storage path on the driver's node, shared by the mock cluster's
nodes), which resumes from the last report that returned and keeps ``num_to_keep``
checkpoints. What node storage must match. ``SYNC`` only: the control shows the
scenario's expectations are Ray's; the ``ASYNC`` path differs from it only inside
node storage, which ``test_train_failures.py`` runs both ways."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from tests.support.train_failures import (
    SMALL_SIZE,
    assert_resumed_from_last_returned_report,
    fit,
    returned_reports,
    trainer_cluster,
)


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[Cluster]:
    yield from trainer_cluster()


def test_on_rays_own_filesystem_a_failure_right_after_a_report_resumes_from_it(
    tmp_path: Path,
) -> None:
    """The worker that reports the checkpoint fails right after its report of step 1:
    the run resumes from step 1, and storage keeps ``num_to_keep`` checkpoints."""
    result = fit(tmp_path, None, fail_rank=0, mode="SYNC", size=SMALL_SIZE)
    assert 1 in returned_reports(tmp_path)
    assert_resumed_from_last_returned_report(result, tmp_path)
