"""The replica registry's record, without Ray: a copy that misses a change is stale
at once, repair makes a copy fresh only after a pass saw no write, commits of one
path are one at a time, under-replicated bytes are counted, repair is paced, and a
registry started again from the saved record knows every stale copy and every
operation still in flight."""

from __future__ import annotations

import pytest

from air_transfer.storage.server.repair import Pace
from air_transfer.storage.server.replica_registry import Begun, ReplicaRegistry, overlap

KEY = "n0:/r"


def begun(r: ReplicaRegistry, paths: list[str], op: str | None = None) -> Begun:
    got = r.begin(KEY, paths, op)
    assert got is not None, f"{paths} held"
    return got


def registry(k: int = 2) -> ReplicaRegistry:
    r = ReplicaRegistry()
    r.register(KEY, [("n0", "/r"), ("n1", "/c/n1")][:k], k, "/c/{node_id}", None)
    return r


def test_a_copy_that_misses_a_change_is_stale_before_it_returns() -> None:
    r = registry()
    op, targets, fresh = begun(r, ["f"])
    assert targets == [("n0", "/r"), ("n1", "/c/n1")] and fresh == ["n0", "n1"]
    assert r.end(KEY, op, ["n1"], ["f"]) == ["n0"]
    assert r.view(KEY) == ([("n0", "/r"), ("n1", "/c/n1")], ["n0"], [], 2)
    assert r.targets(KEY) == ([("n0", "/r")], ["n0"])  # the next write skips it
    r.register(KEY, [("x", "/x")], 1, "/{node_id}", None)  # a known key keeps its record
    assert r.view(KEY) is not None and r.view(KEY)[1] == ["n0"]  # type: ignore[index]


def test_repair_takes_a_stale_member_first_then_a_new_node() -> None:
    r = registry()
    r.end(KEY, begun(r, ["f"])[0], ["n1"], ["f"])
    assert r.plan_repair(KEY, {"n0", "n1", "n2"}) == (("n0", "/r"), ("n1", "/c/n1"))
    assert r.plan_repair(KEY, {"n0", "n1", "n2"}) is None  # one repair at a time
    r.abandon_sync(KEY, "n1")
    # n1 is gone for good (Ray never reuses a node id): n2 takes its place
    assert r.plan_repair(KEY, {"n0", "n2"}) == (("n0", "/r"), ("n2", "/c/n2"))
    assert [n for n, _ in r.view(KEY)[0]] == ["n0", "n2"]  # type: ignore[index]


def test_a_copy_on_a_node_that_will_go_is_made_elsewhere_first() -> None:
    """Ray says n1 will go (downscaled, preempted): its copy does not count towards
    K, repair makes one on a node that stays, and serves from n1 while it lives if
    it holds the only fresh copy; n1 is never a target."""
    r = registry()
    leaving = frozenset({"n1"})
    assert r.under_replicated({"n0", "n1", "n2"}, leaving) == [(KEY, 1, 2)]
    assert r.plan_repair(KEY, {"n0", "n1", "n2"}, leaving) == (("n0", "/r"), ("n2", "/c/n2"))
    assert r.take_touched(KEY, "n2") == (set(), False) and r.finish_sync(KEY, "n2")
    assert r.under_replicated({"n0", "n1", "n2"}, leaving) == []
    other = ReplicaRegistry()
    other.register(KEY, [("n0", "/r"), ("n1", "/c/n1")], 2, "/c/{node_id}", None)
    other.end(KEY, begun(other, ["f"])[0], ["n0"], ["f"])  # n0 stale: n1 alone fresh
    planned = other.plan_repair(KEY, {"n0", "n1", "n2"}, leaving)
    assert planned == (("n1", "/c/n1"), ("n0", "/r"))  # from n1 before it goes
    other.abandon_sync(KEY, "n0")
    assert other.plan_repair(KEY, {"n1"}, leaving) is None  # no node stays: nowhere to go


def test_a_syncing_copy_is_fresh_only_after_a_pass_without_writes() -> None:
    r = registry()
    r.end(KEY, begun(r, [])[0], ["n1"], [])
    r.plan_repair(KEY, {"n0", "n1"})
    op, targets, fresh = begun(r, ["a"])  # a write while n1 syncs goes to it too
    assert [n for n, _ in targets] == ["n0", "n1"] and fresh == ["n0"]
    assert r.take_touched(KEY, "n1") == ({"a"}, True)
    assert not r.finish_sync(KEY, "n1")  # a write in flight
    r.end(KEY, op, [], ["a"])
    assert not r.finish_sync(KEY, "n1")  # "a" was touched since the last take
    assert r.take_touched(KEY, "n1") == ({"a"}, False)
    assert r.finish_sync(KEY, "n1")
    assert r.view(KEY)[1:3] == (["n0", "n1"], [])  # type: ignore[index]


def test_a_syncing_copy_that_misses_a_write_starts_over() -> None:
    r = registry()
    r.end(KEY, begun(r, [])[0], ["n1"], [])
    r.plan_repair(KEY, {"n0", "n1"})
    r.end(KEY, begun(r, ["a"])[0], ["n1"], ["a"])
    assert r.take_touched(KEY, "n1") is None and not r.finish_sync(KEY, "n1")


def test_changes_of_overlapping_paths_are_one_at_a_time() -> None:
    # The path itself, a directory above it, the root, a list holding one of these.
    assert overlap(["d/f"], ["d/f"]) and overlap(["d"], ["d/f"]) and overlap([""], ["x"])
    assert overlap(["e", "d/f/g"], ["d/f"])
    assert not overlap(["d/g"], ["d/f"]) and not overlap(["dx"], ["d"])
    r = registry()
    held = begun(r, ["d/f"])
    other = begun(r, ["d/g"])  # another path is not held up
    assert r.begin(KEY, ["d"], "above") is None  # waits for both
    r.end(KEY, other[0], [], ["d/g"])
    assert r.begin(KEY, ["d"], "above") is None
    r.end(KEY, held[0], [], ["d/f"])
    assert begun(r, ["d"], "above")[0] == "above"


def test_changes_waiting_for_a_path_get_it_in_the_order_they_asked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    r = registry()
    held = r.begin(KEY, ["f"])
    assert held is not None
    assert r.begin(KEY, ["f"], "first") is None and r.begin(KEY, ["f"], "second") is None
    assert r.waiting(KEY) == 2
    r.end(KEY, held[0], [], ["f"])
    assert r.begin(KEY, ["f"], "second") is None  # the first asked before it
    assert r.begin(KEY, ["g"], "elsewhere") is not None  # not in that line
    first = r.begin(KEY, ["f"], "first")
    assert first is not None and r.waiting(KEY) == 1
    r.end(KEY, "first", [], ["f"])
    assert r.begin(KEY, ["f"], "second") is not None and r.waiting(KEY) == 0
    # A caller that stopped asking (it died while it waited) holds no one up.
    r.end(KEY, "second", [], ["f"])
    assert r.begin(KEY, ["f"], "third") is not None
    assert r.begin(KEY, ["f"], "gave-up") is None
    r.end(KEY, "third", [], ["f"])
    monkeypatch.setattr("air_transfer.storage.server.replica_registry.WAITER_S", -1.0)
    assert r.begin(KEY, ["f"], "fourth") is not None


def test_under_replicated_bytes() -> None:
    r = registry()
    r.note_bytes(KEY, 100)
    assert r.missing_bytes({"n0", "n1"}) == 0 and r.under_replicated({"n0", "n1"}) == []
    assert r.missing_bytes({"n0"}) == 100 and r.under_replicated({"n0"}) == [(KEY, 1, 2)]
    assert r.missing_bytes(set()) == 200


def test_repair_is_paced() -> None:
    now = [0.0]
    slept: list[float] = []
    pace = Pace(100.0, clock=lambda: now[0], sleep=slept.append)
    pace.take(50)
    now[0] = 0.2
    pace.take(50)  # 100 bytes by 0.2 s: 0.8 s ahead of 100 B/s
    now[0] = 5.0
    pace.take(10)  # behind the rate: no sleep
    assert slept == [0.5, 0.8]


def test_what_counts_as_a_lost_copy() -> None:
    from ray.exceptions import ActorDiedError

    from air_transfer.errors import CheckpointLostError
    from air_transfer.storage.client.replica_set import is_lost

    assert is_lost(ConnectionError("gone")) and is_lost(ActorDiedError())
    assert not is_lost(FileNotFoundError("answered"))
    # A reader fails over when the copy's chunks are gone; a writer whose source's
    # chunks are gone gets that answer from every copy, none of them stale.
    assert is_lost(CheckpointLostError("x")) and not is_lost(
        CheckpointLostError("x"), reading=False
    )


class SavedRecords:
    """A ``Store`` in a dict: what a registry started again finds."""

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}

    def save(self, key: str, record: bytes) -> None:
        self.records[key] = record

    def load_all(self) -> dict[str, bytes]:
        return dict(self.records)


def saved_registry(store: SavedRecords) -> ReplicaRegistry:
    r = ReplicaRegistry(store)
    r.register(KEY, [("n0", "/r"), ("n1", "/c/n1")], 2, "/c/{node_id}", None)
    return r


def test_a_registry_started_again_knows_every_stale_copy() -> None:
    store = SavedRecords()
    first = saved_registry(store)
    first.end(KEY, begun(first, ["f"])[0], ["n1"], ["f"])
    again = ReplicaRegistry(store)
    assert again.view(KEY) == ([("n0", "/r"), ("n1", "/c/n1")], ["n0"], [], 2)
    assert again.targets(KEY) == ([("n0", "/r")], ["n0"])
    # A copy being re-made when the registry died is stale: its repair died with it.
    assert again.plan_repair(KEY, {"n0", "n1"}) == (("n0", "/r"), ("n1", "/c/n1"))
    assert ReplicaRegistry(store).view(KEY) == ([("n0", "/r"), ("n1", "/c/n1")], ["n0"], [], 2)


def test_an_operation_in_flight_outlives_the_registry() -> None:
    store = SavedRecords()
    first = saved_registry(store)
    first.end(KEY, begun(first, [])[0], ["n1"], [])  # n1 stale
    op, targets, fresh = begun(first, ["f"], "op-1")
    again = ReplicaRegistry(store)
    assert again.begin(KEY, ["f"], "op-1") == (op, targets, fresh)  # retried: the same
    again.plan_repair(KEY, {"n0", "n1"})
    assert again.take_touched(KEY, "n1") == (set(), True)  # the write is in flight
    assert not again.finish_sync(KEY, "n1")
    again.end(KEY, "op-1", [], ["f"])  # its writer's end, retried on the new registry
    assert again.take_touched(KEY, "n1") == ({"f"}, False)
    assert again.finish_sync(KEY, "n1")
    assert ReplicaRegistry(store).view(KEY) == (  # and saved so
        [("n0", "/r"), ("n1", "/c/n1")],
        ["n0", "n1"],
        [],
        2,
    )


def test_a_record_of_another_version_is_refused() -> None:
    store = SavedRecords()
    saved_registry(store)
    store.records[KEY] = store.records[KEY].replace(b'"version": 2', b'"version": 9')
    with pytest.raises(ValueError, match="replica record of version 9"):
        ReplicaRegistry(store)


def test_only_copies_known_to_match_the_storage_node_start_fresh() -> None:
    from air_transfer.storage.client.replica_set import fresh_at_start

    copies = [("n0", "/r"), ("n1", "/c/n1"), ("n2", "/c/n2")]
    assert fresh_at_start(copies, {"n0": True, "n1": True, "n2": True}) == ["n0", "n1", "n2"]
    assert fresh_at_start(copies, {"n0": True, "n1": False, "n2": True}) == ["n0", "n2"]
    assert fresh_at_start(copies, {"n0": False, "n1": True, "n2": False}) == ["n0"]
    r = ReplicaRegistry()
    r.register(KEY, copies[:2], 2, "/c/{node_id}", ["n0"])
    assert r.view(KEY) == (copies[:2], ["n0"], [], 2)
    assert r.plan_repair(KEY, {"n0", "n1"}) == (("n0", "/r"), ("n1", "/c/n1"))
