"""When the replica registry runs its pass over placed files (``placed_schedule``):
on a change of live or draining nodes, a recheck after it and while a node drains,
a bounded backoff after a failed pass, and none at all otherwise; and the order a
pass repairs files in (``placed_repair.Repair``): a leaving node's first, newest
first."""

from __future__ import annotations

from typing import Any

from air_transfer.storage.client.placed_repair import Repair
from air_transfer.storage.placed_record import PlacedRecord
from air_transfer.storage.server.placed_schedule import (
    FIRST_RETRY_S,
    MAX_ATTEMPTS,
    MAX_RETRY_S,
    RECHECK_S,
    PlacedSchedule,
)

A = (frozenset({"a", "b", "c"}), frozenset[str]())
A_DRAINS = (frozenset({"a", "b", "c"}), frozenset({"a"}))
B_LOST = (frozenset({"a", "c"}), frozenset[str]())


def test_a_pass_when_the_nodes_change_and_once_more_after() -> None:
    s = PlacedSchedule()
    assert s.due(A, 0.0)  # the first pass
    assert not s.ran(A, 0.0, [])
    assert not s.due(A, RECHECK_S - 0.1) and s.due(A, RECHECK_S)
    s.ran(A, RECHECK_S, [])
    assert not s.due(A, 1e9)  # nothing changed: no walk of the trees
    assert s.due(B_LOST, RECHECK_S + 0.1)


def test_every_recheck_while_a_node_drains() -> None:
    s = PlacedSchedule()
    for i in range(3):
        s.ran(A_DRAINS, i * RECHECK_S, [])
        assert s.due(A_DRAINS, (i + 1) * RECHECK_S)


def test_a_failing_pass_backs_off_and_gives_up_until_the_nodes_change() -> None:
    s, now, waits = PlacedSchedule(), 0.0, []
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert s.due(B_LOST, now)
        gave_up = s.ran(B_LOST, now, ["/s/ckpt/f"])
        assert gave_up == (attempt == MAX_ATTEMPTS)
        if not gave_up:
            assert s.next_at is not None
            waits.append(s.next_at - now)
            now = s.next_at
    assert waits[0] == FIRST_RETRY_S and waits == sorted(waits) and max(waits) <= MAX_RETRY_S
    assert not s.due(B_LOST, now + 1e6)  # a failing plan is not repeated forever
    assert s.due(A_DRAINS, now)  # until the nodes change
    assert not s.ran(A_DRAINS, now, ["/s/ckpt/f"]) and s.failures == 1


def test_a_leaving_nodes_files_go_first_the_newest_first() -> None:
    record = PlacedRecord(2 << 20, "0" * 24 + "/" + "0" * 32, (("a" * 16, "/p"),), "0" * 64)
    handler: Any = None  # the order is the repair's data alone
    files = [("lost-old", 1.0, False), ("leaving-old", 2.0, True), ("lost-new", 9.0, False)]
    files += [("leaving-new", 8.0, True)]
    repairs = [Repair(handler, path, record, mtime, leaving) for path, mtime, leaving in files]
    order = [r.path for r in sorted(repairs, key=lambda r: r.order)]
    assert order == ["leaving-new", "leaving-old", "lost-new", "lost-old"]
