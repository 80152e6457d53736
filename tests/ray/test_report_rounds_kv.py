"""Committed report rounds in the GCS key-value store (``train.rounds``), against the
real store: ranks (threads here, each with its own worker id) commit a round past a
barrier, and the controller, stopping their group, finds the newest committed one;
a commit that comes after the stop, or in a round with an ``ASYNC`` report, does not
count and leaves nothing behind. The Train runs themselves:
``tests/e2e/test_train_commit.py``."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from air_transfer.cluster import _ray_core
from air_transfer.core.report_rounds import CommittedRound, ReportedRound
from air_transfer.train import rounds

pytestmark = pytest.mark.usefixtures("ray_local")

WORKERS = ["a0" * 8, "b1" * 8]


def reported(
    run: str,
    rank: int,
    index: int,
    path: str | None,
    in_background: bool = False,
    world: int = 2,
) -> ReportedRound:
    metrics = {"step": index} if rank == 0 and not in_background else None
    return ReportedRound(
        run, WORKERS[rank], rank, world, index, path, metrics, False, in_background
    )


def commit_all(reports: list[ReportedRound]) -> list[bool]:
    """Every report of one round committed at once, each rank in its own thread,
    meeting at one barrier as Train's workers meet at theirs."""
    barrier = threading.Barrier(len(reports))
    with ThreadPoolExecutor(len(reports)) as pool:
        return list(pool.map(lambda r: rounds.commit(r, lambda: barrier.wait(30)), reports))


def notes_left(run: str) -> list[str]:
    return _ray_core.kv_keys(rounds.NAMESPACE, rounds._run_prefix(run))


def test_a_committed_round_is_what_the_stopping_controller_finds(tmp_path: Path) -> None:
    """Rank 1 stored the checkpoint, rank 0 reported metrics: both commits return
    True, and the controller finds the round with rank 1's path and rank 0's
    metrics; the group's notes and marks are gone after."""
    run = str(tmp_path)
    rounds.open_group(run, WORKERS)
    assert commit_all([reported(run, 0, 1, None), reported(run, 1, 1, "/c/1")]) == [True, True]
    assert commit_all([reported(run, 0, 2, None), reported(run, 1, 2, "/c/2")]) == [True, True]
    assert rounds.close_group(run, WORKERS) == CommittedRound(2, "/c/2", {"step": 2}, False)
    assert notes_left(run) == []


def test_a_round_processed_by_train_leaves_nothing_to_register(tmp_path: Path) -> None:
    """Train took round 1 (and its notes went): the controller finds nothing of it."""
    run = str(tmp_path)
    rounds.open_group(run, WORKERS)
    commit_all([reported(run, 0, 1, "/c/1"), reported(run, 1, 1, "/c/1")])
    rounds.processed(run, 1)
    assert rounds.close_group(run, WORKERS) is None


def test_a_round_a_rank_never_joined_is_not_committed(tmp_path: Path) -> None:
    """Round 2: rank 0 stored its checkpoint, rank 1 failed before it reported (its
    barrier never came); the controller stops the group: round 1 is the newest
    committed one, and rank 0's waiting commit, let go, does not count."""
    run = str(tmp_path)
    rounds.open_group(run, WORKERS)
    commit_all([reported(run, 0, 1, "/c/1"), reported(run, 1, 1, "/c/1")])
    found: list[CommittedRound | None] = []

    def stopped_meanwhile() -> None:  # rank 0 at the barrier: the group is stopped
        found.append(rounds.close_group(run, WORKERS))

    assert not rounds.commit(reported(run, 0, 2, "/c/2"), stopped_meanwhile)
    assert found == [CommittedRound(1, "/c/1", {"step": 1}, False)]
    assert notes_left(run) == []


def test_a_round_with_an_async_report_waits_for_train(tmp_path: Path) -> None:
    """Rank 1 reported ``ASYNC`` (its upload may still run): rank 0's ``SYNC`` report
    of the round does not commit it, and the controller finds nothing to register."""
    run = str(tmp_path)
    rounds.open_group(run, WORKERS)
    both = [reported(run, 0, 1, "/c/1"), reported(run, 1, 1, None, in_background=True)]
    assert commit_all(both) == [False, True]
    assert rounds.close_group(run, WORKERS) is None


def test_a_commit_after_the_stop_does_not_count_and_leaves_no_note(tmp_path: Path) -> None:
    """A worker of a stopped group commits (it had not been ended yet): False, and
    nothing of it is left for the next group of the run."""
    run = str(tmp_path)
    rounds.open_group(run, WORKERS)
    assert rounds.close_group(run, WORKERS) is None
    assert commit_all([reported(run, 0, 1, "/c/1"), reported(run, 1, 1, "/c/1")]) == [
        False,
        False,
    ]
    rounds.processed(run, 1)  # the metrics rank 0 noted: Train's next group takes round 1
    assert notes_left(run) == []


def test_a_group_never_opened_waits_for_train(tmp_path: Path) -> None:
    """A controller without the hooks opens nothing: the commit says so (the report
    then waits for Train's own registration)."""
    run = str(tmp_path)
    assert commit_all([reported(run, 0, 1, "/c/1", world=1)]) == [False]


def test_two_runs_keep_their_rounds_apart(tmp_path: Path) -> None:
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    rounds.open_group(one, WORKERS[:1])
    rounds.open_group(two, WORKERS[1:])
    assert commit_all([reported(one, 0, 1, "/one/1", world=1)]) == [True]
    assert rounds.close_group(two, WORKERS[1:]) is None
    assert rounds.close_group(one, WORKERS[:1]) == CommittedRound(1, "/one/1", {"step": 1}, False)


def test_a_group_of_one_commits_without_a_barrier(tmp_path: Path) -> None:
    """Alone in its group, a rank meets nobody (a barrier that fails here is never
    called) and notes its metrics with the round; an ``ASYNC`` report notes nothing."""
    run = str(tmp_path)
    rounds.open_group(run, WORKERS[:1])

    def nobody() -> None:
        raise AssertionError("a group of one has no one to meet")

    assert rounds.commit(reported(run, 0, 1, "/c/1", world=1), nobody)
    assert rounds.commit(reported(run, 0, 2, "/c/2", in_background=True, world=1), nobody)
    assert rounds.close_group(run, WORKERS[:1]) == CommittedRound(1, "/c/1", {"step": 1}, False)
