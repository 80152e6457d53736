"""Writer placement's pending markers and the judgment of a holder's blobs
(``storage.client.placed_pending``): a marker names its writer exactly; a blob goes
only when no live writer declared it and no stub names it."""

from __future__ import annotations

import pytest

from air_transfer.core.process_locks import Process, ProcessLock
from air_transfer.storage.client.placed_pending import (
    HolderScan,
    is_blob_name,
    judge,
    marker,
    needs_names,
    parse_marker,
)

DIR = "a" * 24
NODE = "ab" * 28
LIVE = Process(NODE, ProcessLock((66, 1234), "1" * 32 + ".lock"))
DEAD = Process("cd" * 28, ProcessLock((66, 1234), "2" * 32 + ".lock"))
B1, B2, B3 = "1" * 32, "2" * 32, "3" * 32


def marked(blob: str, writer: Process) -> tuple[str, Process]:
    return marker(f"{DIR}/{blob}", writer).split("/")[1], writer


def test_a_marker_names_its_writer_and_its_blob() -> None:
    path = marker(f"{DIR}/{B1}", LIVE)
    directory, name = path.split("/")
    assert directory == DIR
    assert parse_marker(name) == (B1, LIVE)
    assert not is_blob_name(name)
    assert is_blob_name(B1)


@pytest.mark.parametrize(
    "name",
    [B1, f"{B1}.writer-", f".{B1}.writer-{NODE}-1-2-{'1' * 32}", f"{B1}.writer-{NODE}-1-2-xyz"],
)
def test_other_names_are_no_markers(name: str) -> None:
    assert parse_marker(name) is None


def test_a_marker_of_a_lock_not_named_by_process_locks_is_refused() -> None:
    odd = Process(NODE, ProcessLock((1, 2), "not-a-lock"))
    with pytest.raises(ValueError, match="pending marker"):
        marker(f"{DIR}/{B1}", odd)


def scan(markers: dict[str, tuple[tuple[str, Process], ...]]) -> HolderScan:
    return HolderScan(NODE, "/r", DIR, {B1: 10, B2: 20, B3: 30}, markers)


def test_only_unnamed_blobs_no_live_writer_declared_go() -> None:
    s = scan({B1: (marked(B1, LIVE),), B2: (marked(B2, DEAD),)})
    found = {
        (v.path.rsplit("/", 1)[1], v.kind, v.nbytes, v.action)
        for v in judge(s, {DEAD}, frozenset())
    }
    assert (
        B1,
        "placed",
        10,
        "kept: its writer (on node abababababab) is alive and may still name it",
    ) in found
    assert (B2, "placed", 20, "would remove") in found  # its writer is dead
    assert (B3, "placed", 30, "would remove") in found  # declared by nobody
    assert (marked(B2, DEAD)[0], "placed-marker", 0, "would remove") in found
    assert len(found) == 4  # the live writer's marker is left alone


def test_a_named_blob_stays_and_a_dead_writers_marker_of_it_goes() -> None:
    s = scan({B2: (marked(B2, DEAD),)})
    named = frozenset({f"{DIR}/{B1}", f"{DIR}/{B2}", f"{DIR}/{B3}"})
    found = [(v.path.rsplit("/", 1)[1], v.action) for v in judge(s, {DEAD}, named)]
    assert found == [(marked(B2, DEAD)[0], "would remove")]


def test_a_blob_one_live_writer_declared_stays_whatever_others_did() -> None:
    s = scan({B1: (marked(B1, DEAD), marked(B1, LIVE))})
    [kept] = [v for v in judge(s, {DEAD}, frozenset()) if v.path.endswith(B1)]
    assert kept.action.startswith("kept: its writer")


def test_stubs_are_listed_only_when_a_blob_may_go() -> None:
    live_only = HolderScan(NODE, "/r", DIR, {B1: 1}, {B1: (marked(B1, LIVE),)})
    assert not needs_names([live_only], set())
    assert needs_names([live_only], {LIVE})
    undeclared = HolderScan(NODE, "/r", DIR, {B1: 1}, {})
    assert needs_names([live_only, undeclared], set())
    marker_only = HolderScan(NODE, "/r", DIR, {}, {B1: (marked(B1, DEAD),)})
    assert needs_names([marker_only], {DEAD})
