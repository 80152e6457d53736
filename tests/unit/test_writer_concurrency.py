"""Concurrent writers of one target, in threads and processes: each publishes one
whole version, one at a time, and never fails on another one's swap."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from air_transfer.core import merge
from air_transfer.core.dirtree import DirCursor, Visit
from air_transfer.core.writer import write_tree
from air_transfer.storage.server.metadata import DiskStorage
from tests.support.trees import build_manifest, file_contents, leftovers
from tests.support.writer_child import race_files
from tests.support.writer_procs import TIMEOUT, Child, put_files, tree_of

TAGS, ROUNDS = ("t0", "t1", "t2"), 3


def write_at_once(manifests: dict[str, list[Any]], target: Path) -> list[BaseException]:
    """One thread per writer, released together, each writing its manifests into
    ``target`` in turn; what any of them raised."""
    start, errors = threading.Barrier(len(manifests)), []

    def run(tag: str) -> None:
        try:
            start.wait(timeout=TIMEOUT)
            for manifest, chunks in manifests[tag]:
                write_tree(manifest, chunks, target)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in manifests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=TIMEOUT)
    return errors


def assert_all_merged(target: Path, keep: bool, tags: tuple[str, ...] = TAGS) -> None:
    """Every writer's last round is in, whole; ``common`` is one writer's."""
    got = file_contents(target)
    common = got.pop("common")
    assert common in {race_files(tag, ROUNDS - 1)["common"] for tag in tags}
    expected: dict[str, bytes | str] = {"keep": b"mine"} if keep else {}
    for tag in tags:
        last = race_files(tag, ROUNDS - 1)
        del last["common"]
        expected |= tree_of(last)
    assert got == expected
    assert leftovers(target.parent) == []


@pytest.mark.parametrize("keep", [False, True], ids=["fresh-target", "existing-target"])
def test_concurrent_merges_in_threads_each_publish_whole(tmp_path: Path, keep: bool) -> None:
    target = tmp_path / "out"
    if keep:
        put_files(target, {"keep": b"mine"})
    manifests = {tag: [build_manifest(race_files(tag, r)) for r in range(ROUNDS)] for tag in TAGS}
    errors = write_at_once(manifests, target)
    assert not errors, errors
    assert_all_merged(target, keep)


def test_concurrent_merges_in_processes_each_publish_whole(tmp_path: Path) -> None:
    """Processes racing for a fresh target: one publishes it by rename, the others
    merge into it, each whole (threads above cover an existing target too)."""
    target = tmp_path / "out"
    children = [Child("race", str(target), tag, str(ROUNDS)) for tag in TAGS]
    try:
        for child in children:
            child.wait_for("ready")
        for child in children:  # as close to together as processes get
            assert child.proc.stdin is not None
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
    finally:
        for child in children:
            child.finish()
    assert_all_merged(target, keep=False)


def version(tag: str, round_: int = 0) -> dict[str, bytes]:
    """One writer's version of a small tree: the same paths in every version, so the
    target after any merge is exactly the version merged last."""
    return {f"d{i}/f{j}": f"{tag} {round_} {i} {j}".encode() for i in range(4) for j in range(2)}


def test_a_writer_whose_target_is_swapped_during_its_check_publishes_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: a writer walked the existing target (the merge check) before taking the
    publish lock; another writer that swapped the target meanwhile removed the old
    tree under the walk, and the first one failed with a stray FileNotFoundError
    (about 1 in 2,000 writes of concurrent writers). Here the first writer is held in
    that walk, just before it enters a directory, while the second one publishes."""
    target = tmp_path / "out"
    put_files(target, version("old"))
    held, go, errors = threading.Event(), threading.Event(), []
    walk = merge.walk

    def held_walk(cursor: DirCursor) -> Iterator[Visit]:
        for visit in walk(cursor):
            yield visit
            mine = threading.current_thread().name == "held"
            if visit.event == "enter" and mine and not held.is_set():
                held.set()
                assert go.wait(TIMEOUT)

    def write_held() -> None:
        try:
            write_tree(*build_manifest(version("held")), target)
        except BaseException as e:
            errors.append(e)

    monkeypatch.setattr(merge, "walk", held_walk)
    writer = threading.Thread(target=write_held, name="held")
    writer.start()
    try:
        assert held.wait(TIMEOUT), "the writer never walked the target"
        write_tree(*build_manifest(version("other")), target)  # swaps, removes the old
        assert file_contents(target) == tree_of(version("other"))
    finally:
        go.set()
        writer.join(TIMEOUT)
    assert not errors, errors
    assert file_contents(target) == tree_of(version("held"))
    assert leftovers(tmp_path) == []


WRITERS, WRITES = 4, 50


def test_concurrent_writers_of_one_target_each_publish_a_whole_version(tmp_path: Path) -> None:
    """Many writers of one target in a loop (the race above, left to chance): every
    write publishes a whole version, and the target ends as exactly the version one
    writer wrote last."""
    target = tmp_path / "out"
    manifests = {
        f"w{k}": [build_manifest(version(f"w{k}", r)) for r in range(WRITES)]
        for k in range(WRITERS)
    }
    errors = write_at_once(manifests, target)
    assert not errors, errors
    last = [tree_of(version(tag, WRITES - 1)) for tag in manifests]
    assert file_contents(target) in last
    assert leftovers(tmp_path) == []


def test_listings_and_writers_never_reclaim_a_live_writers_staging(tmp_path: Path) -> None:
    """What reclaims dead writers' staging (every node storage listing, every
    writer's clean-up of the parent) runs while writers in other processes and in
    this one publish into the same directory: no live writer's staging, lock file or
    publish lock is taken from it (each writer publishes every round, whole), and no
    listing shows a name the library made."""
    exp = tmp_path / "exp"
    exp.mkdir()
    children = [Child("race", str(exp / "out"), tag, str(ROUNDS)) for tag in TAGS]
    mine = ("m0", "m1")
    manifests = {tag: [build_manifest(race_files(tag, r)) for r in range(ROUNDS)] for tag in mine}
    errors: list[BaseException] = []
    writing = threading.Event()

    def write(tag: str) -> None:
        try:
            for manifest, chunks in manifests[tag]:
                write_tree(manifest, chunks, exp / "mine")
        except BaseException as e:
            errors.append(e)

    def list_while_writing() -> None:
        try:
            while writing.is_set():
                listed = DiskStorage().fs_list(str(tmp_path), str(exp), True, False)
                assert not [path for path, *_ in listed if ".air-" in path], listed
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(tag,)) for tag in mine]
    listers = [threading.Thread(target=list_while_writing) for _ in range(2)]
    try:
        for child in children:
            child.wait_for("ready")
        writing.set()
        for t in listers + threads:
            t.start()
        for child in children:
            assert child.proc.stdin is not None
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
    finally:
        for child in children:
            child.finish()
        for t in threads:
            t.join(timeout=TIMEOUT)
        writing.clear()
        for t in listers:
            t.join(timeout=TIMEOUT)
    assert not errors, errors
    assert_all_merged(exp / "out", keep=False)
    assert_all_merged(exp / "mine", keep=False, tags=mine)
