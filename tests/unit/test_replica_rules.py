"""The rules of node storage replicas that need no Ray: a copy's root is claimed
with a marker (two copies in one directory, a root of someone else's files and one
of another storage are refused; a marker of an earlier cluster is taken over, and
emptying a copy keeps it); roots that cannot keep copies are refused; a full disk
is a lost copy; a dead caller's operation is fenced off on an agent; which caller
counts as dead; repairs that fail are retried, then given up on, visibly; records
keep what they hold across a registry started again."""

from __future__ import annotations

import errno
import json
import os
import threading
from pathlib import Path

import pytest

from air_transfer.storage.replica_wire import Owner
from air_transfer.storage.server.dead_ops import caller_dead
from air_transfer.storage.server.metadata import DiskStorage
from air_transfer.storage.server.op_fence import OpFence
from air_transfer.storage.server.replica_marker import MARKER, claim
from air_transfer.storage.server.replica_record import MAX_ATTEMPTS, Op, Replicated
from air_transfer.storage.server.replica_registry import ReplicaRegistry

KEY = "n0:/r"


def test_a_copys_root_is_claimed_once_per_storage_and_node(tmp_path: Path) -> None:
    root = str(tmp_path / "c")
    assert claim(root, KEY, "n1", ["n0", "n1"], [KEY], adopt=False) is False
    assert os.listdir(root) == [MARKER]
    (tmp_path / "c" / "f").write_bytes(b"x")
    assert claim(root, KEY, "n1", ["n0", "n1"], [KEY], adopt=False) is True  # its own
    # Another copy of the storage in the same directory (a shared disk).
    with pytest.raises(ValueError, match=r"nodes n1 and n2 are one directory"):
        claim(root, KEY, "n2", ["n1", "n2"], [KEY], adopt=False)
    # Another storage in use.
    with pytest.raises(ValueError, match="already a copy of node storage n0:/r"):
        claim(root, "n5:/s", "n5", ["n5"], [KEY, "n5:/s"], adopt=False)
    # A storage this cluster does not know (an earlier cluster's): taken over.
    assert claim(root, "n5:/s", "n5", ["n5"], ["n5:/s"], adopt=False) is True
    marker = json.loads((tmp_path / "c" / MARKER).read_bytes())
    assert (marker["storage"], marker["node"]) == ("n5:/s", "n5")


def test_a_root_of_someone_elses_files_is_refused_unless_it_is_the_storages(
    tmp_path: Path,
) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_bytes(b"the user's")
    with pytest.raises(ValueError, match=r"holds files this storage did not write \('notes.txt'"):
        claim(str(mine), KEY, "n1", ["n0", "n1"], [], adopt=False)
    assert os.listdir(mine) == ["notes.txt"]  # untouched, no marker left
    # The storage node's own root keeps what it holds (it is the source of the copies).
    assert claim(str(mine), KEY, "n0", ["n0", "n1"], [], adopt=True) is True
    with pytest.raises(ValueError, match="'/' cannot be a copy"):
        claim("/", KEY, "n0", ["n0"], [], adopt=True)


def test_emptying_a_copy_keeps_its_marker(tmp_path: Path) -> None:
    root = str(tmp_path / "c")
    claim(root, KEY, "n1", ["n1"], [KEY], adopt=False)
    (tmp_path / "c" / "d").mkdir()
    (tmp_path / "c" / "f").write_bytes(b"x")
    DiskStorage().fs_delete_dir_contents(root, root, False)
    assert os.listdir(root) == [MARKER]


def test_roots_that_cannot_keep_copies() -> None:
    from air_transfer.storage.client.replica_set import check_roots

    check_roots("/", "/", 1)  # one copy: the single-copy storage, unchanged
    with pytest.raises(ValueError, match="needs a dedicated root"):
        check_roots("/", "/c/{node_id}", 2)
    with pytest.raises(ValueError, match="whole disk"):
        check_roots("/s", "/", 2)
    with pytest.raises(ValueError, match="lies inside root"):
        check_roots("/s", "/s/copies/{node_id}", 2)
    check_roots("/data/s", "/data/s", 2)  # the default: the same path on each node
    check_roots("/data/copies/n0", "/data/copies/{node_id}", 2)  # the test layout


def test_a_full_disk_is_a_lost_copy_unless_every_copy_is_full() -> None:
    from air_transfer.storage.client.replicas import ReplicatedHandler

    h = ReplicatedHandler("n0", "/r")
    full = OSError(errno.ENOSPC, "No space left on device")
    assert h.judge({"n0": full, "n1": None}, ["n0", "n1"]) == (None, ["n0"])
    assert h.judge({"n0": None, "n1": full}, ["n0", "n1"]) == (None, ["n1"])
    answer, missed = h.judge({"n0": full, "n1": full}, ["n0", "n1"])
    assert answer is full and missed == []  # no copy took it: the caller's to know
    other = FileNotFoundError(errno.ENOENT, "gone")
    assert h.judge({"n0": other, "n1": None}, ["n0", "n1"]) == (other, ["n1"])


def test_a_fenced_operation_lands_nowhere_after_the_fence() -> None:
    fence = OpFence()
    entered, release = threading.Event(), threading.Event()

    def running() -> None:
        with fence.running("op"):
            entered.set()
            release.wait(30)

    t = threading.Thread(target=running)
    t.start()
    entered.wait(30)
    assert fence.fence(["op"], 0.05) == ["op"]  # still running after the timeout
    release.set()
    assert fence.fence(["op"], 30) == []  # done: fenced whole
    t.join(30)
    with pytest.raises(PermissionError, match="arrived late and was refused"), fence.running("op"):
        pass
    with fence.running(""), fence.running("another"):  # other calls run as ever
        pass


def test_which_callers_count_as_dead() -> None:
    op = Op(["n0"], ["n0"], ["f"], 1000.0, Owner("w1", "n1"))
    answers = {"w1": True}
    assert not caller_dead(op, {"n0", "n1"}, answers.get, 1001.0)
    assert caller_dead(op, {"n0"}, answers.get, 1001.0)  # its node is gone
    answers["w1"] = False
    assert caller_dead(op, {"n0", "n1"}, answers.get, 1001.0)
    # Ray cannot tell, or an older record without its caller: after the busy timeout.
    unknown: dict[str, bool | None] = {"w1": None}
    assert not caller_dead(op, {"n0", "n1"}, unknown.get, 1100.0)
    assert caller_dead(op, {"n0", "n1"}, unknown.get, 1400.0)
    assert caller_dead(Op(["n0"], ["n0"], ["f"], 1000.0), {"n0"}, unknown.get, 1400.0)


def test_a_copy_whose_repair_fails_is_retried_then_given_up_visibly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [1000.0]
    monkeypatch.setattr("air_transfer.storage.server.replica_registry.time.time", lambda: now[0])
    r = ReplicaRegistry()
    r.register(KEY, [("n0", "/r"), ("n1", "/c/n1")], 2, "/c/{node_id}", ["n0"])
    live = {"n0", "n1", "n2"}
    for attempt in range(1, MAX_ATTEMPTS + 1):
        assert r.plan_repair(KEY, live) == (("n0", "/r"), ("n1", "/c/n1"))
        r.repair_failed(KEY, "n1", "FileExistsError: /c/n1")
        [_, n1] = r.status(KEY)
        assert (n1.attempts, n1.error) == (attempt, "FileExistsError: /c/n1")
        if attempt < MAX_ATTEMPTS:
            assert n1.state == "failing"
            assert r.plan_repair(KEY, live) is None  # its turn comes later, not a spare's
            now[0] += 2.0**attempt
    assert n1.state == "failed"
    # Given up on: a node that holds no copy takes its place.
    assert r.plan_repair(KEY, live) == (("n0", "/r"), ("n2", "/c/n2"))
    assert [s.state for s in r.status(KEY)] == ["fresh", "failed", "syncing"]
    r.retry_failed(KEY)  # the filesystem made again: its cause may be fixed
    assert [s.state for s in r.status(KEY)] == ["fresh", "stale", "syncing"]


def test_more_copies_when_asked() -> None:
    r = ReplicaRegistry()
    r.register(KEY, [("n0", "/r"), ("n1", "/c/n1")], 2, "/c/{node_id}", None)
    assert r.resize(KEY, 3) == 2 and r.resize(KEY, 2) == 3  # never fewer
    assert r.under_replicated({"n0", "n1", "n2"}) == [(KEY, 2, 3)]
    assert r.plan_repair(KEY, {"n0", "n1", "n2"}) == (("n0", "/r"), ("n2", "/c/n2"))


def test_records_keep_callers_staging_and_failures() -> None:
    s = Replicated(2, {"n0": "/r", "n1": "/c/n1"}, {"n0"}, "/c/{node_id}")
    s.ops["op"] = Op(["n0", "n1"], ["n0"], ["f"], 5.0, Owner("w", "n9"), {"n1": "/c/n1/.f.x"})
    r = ReplicaRegistry()
    r.register(KEY, list(s.roots.items()), 2, s.template, None)
    r._storages[KEY] = s
    r.repair_failed(KEY, "n1", "OSError: full")
    again = Replicated.from_record(r._storages[KEY].to_record())
    assert again.ops == s.ops and again.failures["n1"].error == "OSError: full"
    # A record saved before callers and failures were kept (version 1) still loads.
    old = json.loads(again.to_record())
    old["version"] = 1
    del old["failures"]
    for rec in old["ops"].values():
        del rec["owner"], rec["staging"]
    loaded = Replicated.from_record(json.dumps(old).encode())
    assert loaded.ops["op"].owner is None and loaded.failures == {}
