"""Which round a stopping Ray Train worker group's controller registers from what its
workers noted (``core.report_rounds``): the newest round a rank noted done, with the
checkpoint the lowest such rank stored and rank 0's metrics of that round; and which
reports promise their checkpoint the moment they return."""

from __future__ import annotations

from air_transfer.core.report_rounds import (
    CommittedRound,
    ReportedRound,
    RoundRecord,
    newest_committed,
    record_of,
)

PATH = "/root/run/checkpoint_3"


def test_no_round_done_is_nothing_to_register() -> None:
    assert newest_committed([], {3: {"step": 3}}) is None


def test_the_newest_done_round_is_registered_with_rank_0s_metrics() -> None:
    """Rank 1 stored the checkpoint of round 3 and noted it done; rank 0 reported
    metrics only: the path is rank 1's, the metrics rank 0's of round 3."""
    records = [RoundRecord(2, 1, PATH + "-2", False), RoundRecord(3, 1, PATH, {"timeout_s": 5})]
    metrics = {2: {"step": 2}, 3: {"step": 3}}
    assert newest_committed(records, metrics) == CommittedRound(
        3, PATH, {"step": 3}, {"timeout_s": 5}
    )


def test_every_rank_stored_the_one_directory_the_lowest_rank_says_which() -> None:
    records = [RoundRecord(5, 3, PATH, True), RoundRecord(5, 1, PATH, False)]
    assert newest_committed(records, {}) == CommittedRound(5, PATH, {}, False)


def test_only_a_sync_report_that_stored_a_checkpoint_promises_it() -> None:
    """A report promises its checkpoint from its return only if it stored one there:
    not a report of metrics, not an ``ASYNC`` one (stored later)."""
    stored = ReportedRound("/run", "w0", 0, 2, 4, PATH, {"step": 4}, False)
    assert stored.promises
    assert not ReportedRound("/run", "w0", 0, 2, 4, None, {"step": 4}, False).promises
    in_background = ReportedRound("/run", "w0", 0, 2, 4, PATH, None, False, in_background=True)
    assert not in_background.promises
    assert record_of(stored) == RoundRecord(4, 0, PATH, False)


def test_rank_0_alone_notes_its_metrics_with_the_round() -> None:
    """Alone in its group, rank 0 notes its metrics in its record of the round done
    (nobody else could note the round done before it): they are the round's."""
    alone = ReportedRound("/run", "w0", 0, 1, 4, PATH, {"step": 4}, False)
    assert record_of(alone) == RoundRecord(4, 0, PATH, False, {"step": 4})
    assert newest_committed([record_of(alone)], {}) == CommittedRound(4, PATH, {"step": 4}, False)
