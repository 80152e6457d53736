"""The storage node's disk services called by several threads at once, as the agent's
32 threads call them: what each caller gets, and nothing lost or left behind (no Ray)."""

from __future__ import annotations

import functools
import os
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pyarrow.fs as pafs

from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.node_api import Commit
from tests.support.disk import Disk

THREADS, ROUNDS = 8, 40


def race(calls: list[Callable[[], object]]) -> Counter[str]:
    """Run ``calls`` in threads released together; ``"ok"`` or the exception's type
    name for each."""
    start = threading.Barrier(len(calls))
    outcomes: Counter[str] = Counter()

    def run(call: Callable[[], object]) -> None:
        start.wait()
        try:
            call()
            outcomes["ok"] += 1
        except Exception as e:
            outcomes[type(e).__name__] += 1

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def make_tree(top: Path, width: int = 3) -> None:
    for i in range(width):
        (top / f"s{i}" / "t").mkdir(parents=True)
        for j in range(4):
            (top / f"s{i}" / f"f{j}").write_bytes(b"x")
            (top / f"s{i}" / "t" / f"g{j}").write_bytes(b"y")


def leftovers(top: Path) -> list[str]:
    """Hidden staging files or trash of node storage under ``top``."""
    return [p.name for p in top.rglob("*") if ".air-upload-" in p.name or ".air-trash-" in p.name]


def test_concurrent_create_dir_of_one_path_all_succeed(tmp_path: Path) -> None:
    """Defect: the agent checked isdir, then called makedirs without exist_ok; of
    callers creating one directory at once (Ray Train's workers creating
    ``checkpoint_...``), all but the first raised FileExistsError."""
    disk, root = Disk(), str(tmp_path)
    for r in range(ROUNDS):
        deep, flat = f"{root}/r{r}/a/b/c", f"{root}/r{r}"
        calls = [functools.partial(disk.fs_create_dir, root, deep, True)] * (THREADS // 2)
        calls += [functools.partial(disk.fs_create_dir, root, flat, False)] * (THREADS // 2)
        assert race(calls) == {"ok": THREADS}, f"round {r}"
        assert os.path.isdir(deep)


def test_concurrent_delete_dir_exactly_one_succeeds(tmp_path: Path) -> None:
    """Defect: concurrent deletions of one tree tripped over each other inside
    ``shutil.rmtree`` (FileNotFoundError for an entry another one removed), so none
    might succeed. Now exactly one does and the others find nothing (as with
    LocalFileSystem), and nothing hidden is left."""
    disk, root = Disk(), str(tmp_path)
    for r in range(ROUNDS // 4):
        make_tree(tmp_path / "x")
        outcomes = race([lambda: disk.fs_delete_dir(root, f"{root}/x")] * THREADS)
        assert outcomes == {"ok": 1, "FileNotFoundError": THREADS - 1}, f"round {r}"
        assert os.listdir(tmp_path) == []


def test_concurrent_delete_dir_contents_all_succeed(tmp_path: Path) -> None:
    """Defect: an entry removed by a concurrent caller failed the walk with
    FileNotFoundError although the directory exists; emptying an emptied
    directory succeeds."""
    disk, root = Disk(), str(tmp_path)
    for r in range(ROUNDS // 4):
        make_tree(tmp_path / "x")
        calls = [lambda: disk.fs_delete_dir_contents(root, f"{root}/x", False)] * THREADS
        assert race(calls) == {"ok": THREADS}, f"round {r}"
        assert os.listdir(tmp_path / "x") == []


def test_listing_while_the_tree_is_deleted(tmp_path: Path) -> None:
    """Defect: a recursive listing racing a deletion raised FileNotFoundError for a
    subdirectory that vanished under it, or listed vanished entries as NotFound.
    Now a listing either ran first (ok, only entries that exist) or after (the base
    is gone: FileNotFoundError). Either may win every round: neither is required."""
    disk, root = Disk(), str(tmp_path)
    listings: list[list[tuple[str, int, int | None, int | None]]] = []
    for r in range(ROUNDS // 2):
        make_tree(tmp_path / "x", width=6)

        def listing() -> None:
            listings.append(disk.fs_list(root, f"{root}/x", True, False))

        outcomes = race([listing] * (THREADS - 1) + [lambda: disk.fs_delete_dir(root, f"{root}/x")])
        assert set(outcomes) <= {"ok", "FileNotFoundError"}, f"round {r}: {outcomes}"
    found = [e for entries in listings for e in entries]
    assert found, "no listing ran before its deletion: nothing was checked"
    assert all(t != pafs.FileType.NotFound for _, t, _, _ in found)


def test_concurrent_appends_lose_nothing_silently(tmp_path: Path) -> None:
    """Defect: an append copies the file, then renames its copy over it; of two at
    once, the second rename dropped the first one's bytes without an error. Now an
    append that would drop bytes fails (ESTALE): every byte of every append that
    succeeded is in the file."""
    disk, root, target = Disk(), str(tmp_path), str(tmp_path / "log")
    block = b"0123456789" * 100
    for r in range(ROUNDS // 4):
        Path(target).write_bytes(b"head")

        def append() -> None:
            staging, start, expect = disk.fs_open_write(root, target, append=True)
            check, end = chunk_checksum(block), start + len(block)
            disk.fs_commit(root, Commit(target, staging, start, block, check, end, False, expect))

        outcomes = race([append] * THREADS)
        assert outcomes["ok"] >= 1 and set(outcomes) <= {"ok", "OSError"}, f"round {r}"
        assert Path(target).read_bytes() == b"head" + block * outcomes["ok"], f"round {r}"
        assert leftovers(tmp_path) == []
