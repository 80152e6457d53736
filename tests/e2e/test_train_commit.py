"""A ``SYNC`` report into node storage returns once its round is committed, not at
Train's next poll: two ranks each store a shard of every step's checkpoint, and the
failures that matter around a commit. Train's controller is held in a callback while
a rank's report returns and the rank is killed (SIGKILL) right after, so no poll of
Train's sees that rank's report: the restart still resumes from the committed round,
whole, because the controller registers it from what the workers noted before it
stops the group. A rank failing mid-report (its upload) leaves the round
uncommitted, and its checkpoint is deleted. ``tests/support/train_commit.py`` has the run.

(Before, a ``SYNC`` report waited for Train's registration: with the controller held
it never returned, and the callback let go at its deadline, saying so.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from ray.cluster_utils import Cluster

import air_transfer
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from tests.support.cluster import node_ids
from tests.support.replicas import copies_identical
from tests.support.s3 import S3Server, bucket_server
from tests.support.train_commit import fit, kept_alone, resumed_from, returned
from tests.support.train_failures import trainer_cluster


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[Cluster]:
    yield from trainer_cluster()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "runs")


@pytest.fixture(scope="module")
def fs(tmp_path_factory: pytest.TempPathFactory) -> pafs.FileSystem:
    """Node storage on the head node, rooted at the session's temporary directory."""
    return air_transfer.storage_filesystem(root=str(tmp_path_factory.getbasetemp()))


@pytest.mark.parametrize("kill_rank", [0, 1])
def test_a_rank_killed_right_after_its_report_resumes_from_the_committed_round(
    tmp_path: Path, fs: pafs.FileSystem, kill_rank: int
) -> None:
    """Both ranks' reports of step 1 return while Train's controller is held (it has
    registered nothing of step 1), then rank ``kill_rank`` is killed: the restart
    restores step 1 with both shards, and storage holds only what Train keeps."""
    result = fit(
        tmp_path, fs, str(tmp_path / "storage"), hold_at=0, kill_rank=kill_rank, kill_after=1
    )
    assert (tmp_path / "held").read_text() == "released"
    step_1 = returned(tmp_path, 1)
    assert step_1 is not None and set(step_1) == {"shard-0.bin", "shard-1.bin", "state.json"}
    assert resumed_from(result) == (1, step_1)
    assert {"step": 1, "rank": 0} in [m for _, m in result.best_checkpoints]  # rank 0's
    kept_alone(result, tmp_path / "storage" / "run")


def test_a_worker_alone_killed_right_after_its_report_resumes_from_it(
    tmp_path: Path, fs: pafs.FileSystem
) -> None:
    """One worker (no one to meet): its report of step 1 returns while the controller
    is held, it is killed, and the restart restores step 1."""
    result = fit(tmp_path, fs, str(tmp_path / "storage"), 0, workers=1, kill_rank=0, kill_after=1)
    assert (tmp_path / "held").read_text() == "released"
    step_1 = returned(tmp_path, 1, workers=1)
    assert step_1 is not None and resumed_from(result) == (1, step_1)
    assert {"step": 1, "rank": 0} in [m for _, m in result.best_checkpoints]
    kept_alone(result, tmp_path / "storage" / "run")


def test_a_rank_failing_mid_report_leaves_the_round_uncommitted(
    tmp_path: Path, fs: pafs.FileSystem
) -> None:
    """Rank 0 stored its shard of step 1 and waits for the others; rank 1's upload of
    step 1 fails. Rank 0's report never returns, the restart restores step 0, and step
    1's directory of the first attempt (rank 0's shard alone) is deleted."""
    result = fit(tmp_path, fs, str(tmp_path / "storage"), hold_at=None, fail_rank=1, fail_mid=1)
    assert not (tmp_path / "returned" / "1-0").exists()
    step_0 = returned(tmp_path, 0)
    assert step_0 is not None
    assert resumed_from(result) == (0, step_0)
    kept_alone(result, tmp_path / "storage" / "run")


def test_with_replicas_the_committed_round_is_kept_on_every_copy(tmp_path: Path) -> None:
    """The same kill into ``storage_filesystem(replicas=2)`` (the head and node_a):
    the restart restores step 1, and both copies hold exactly the kept checkpoints."""
    ids = node_ids()
    copies = tmp_path / "copies"
    fs = air_transfer.storage_filesystem(
        root=str(copies / ids["head"]),
        replicas=2,
        replica_nodes=(ids["node_a"],),
        replica_root=str(copies / "{node_id}"),
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, ReplicatedHandler)
    result = fit(tmp_path, fs, f"{handler.root}/runs", hold_at=0, kill_rank=0, kill_after=1)
    assert (tmp_path / "held").read_text() == "released"
    step_1 = returned(tmp_path, 1)
    assert step_1 is not None and resumed_from(result) == (1, step_1)
    kept_alone(result, copies / ids["head"] / "runs" / "run")
    stored = copies_identical(handler, 2)
    on_copies = sorted(
        p.split("/")[2] for p, body in stored.items() if p.count("/") == 2 and body is None
    )
    assert on_copies == sorted(Path(c.path).name for c, _ in result.best_checkpoints)


def test_with_a_durable_tier_the_registered_round_is_the_one_restored(
    tmp_path: Path, s3: S3Server
) -> None:
    """The same kill into node storage with a durable tier: the restart's checkpoint
    is chosen among the whole ones (``restore_choice``), and step 1's, registered by
    the stopping controller and held by node storage whether drained yet or not, is
    the one restored; the tier then holds it too."""
    fs = air_transfer.storage_filesystem(
        root=str(tmp_path / "node"), durable=s3.uri("runs", "commit")
    )
    result = fit(tmp_path, fs, str(tmp_path / "node" / "runs"), 0, kill_rank=1, kill_after=1)
    assert (tmp_path / "held").read_text() == "released"
    step_1 = returned(tmp_path, 1)
    assert step_1 is not None and resumed_from(result) == (1, step_1)
    kept_alone(result, tmp_path / "node" / "runs" / "run")
    assert {"step": 1, "rank": 0} in [m for _, m in result.best_checkpoints]
    air_transfer.wait_durable(fs, timeout=120)
    kept = [air_transfer.storage_state(fs, c.path).tier for c, _ in result.best_checkpoints]
    assert kept == ["durable"] * len(result.best_checkpoints)
