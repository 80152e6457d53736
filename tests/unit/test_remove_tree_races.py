"""The tree remover, ``core.tree_removal``, while the tree changes under it: two
removers of one tree at once, a directory refilled while removed, a way back up
that is gone, a top replaced and a directory moved out of the tree (no Ray)."""

from __future__ import annotations

import errno
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from air_transfer.core.tree_removal import ROUNDS, rmtree
from tests.support.removers import by_entry, by_path


def test_two_removers_of_one_tree_at_once_both_succeed(tmp_path: Path) -> None:
    """Each skips what the other removed (``air-transfer clean`` and a delete share a
    trash directory): both return, the tree is gone, and every entry was removed by
    exactly one of them. At least one trial must have had both remove entries, else
    the race was never run; which one removes what is up to the scheduler."""
    entries = 1 + 4 * (1 + 3 * (1 + 5))
    both = 0
    for trial in range(20):
        top = tmp_path / f"t{trial}"
        for i in range(4):
            for j in range(3):
                (top / f"a{i}" / f"b{j}").mkdir(parents=True)
                for k in range(5):
                    (top / f"a{i}" / f"b{j}" / f"f{k}").write_bytes(b"")
        counts = _race([functools.partial(by_path, top), functools.partial(by_entry, top)])
        assert sum(counts) == entries, f"trial {trial}: {counts}"
        assert not top.exists(), f"trial {trial}"
        both += all(counts)
    assert both > 0, "the removers never worked in the tree at the same time"


def _race(calls: list[Callable[[], int]]) -> list[int]:
    """What each of ``calls`` returned, run in threads released together."""
    start = threading.Barrier(len(calls))

    def released(call: Callable[[], int]) -> int:
        start.wait(timeout=60)
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result(timeout=60) for f in [pool.submit(released, c) for c in calls]]


@pytest.mark.parametrize("refills", [ROUNDS, ROUNDS + 1])
def test_a_directory_filling_up_while_removed_is_emptied_again_a_few_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refills: int
) -> None:
    """Each ``rmdir`` of ``busy`` finds a new file and a new directory in it first: up
    to ``ROUNDS`` times they are removed too; then ENOTEMPTY names the directory."""
    (tmp_path / "t" / "busy").mkdir(parents=True)
    rmdir, made = os.rmdir, list[str]()

    def filling_rmdir(name: str, *, dir_fd: int | None = None) -> None:
        if name == "busy" and len(made) < refills:
            made.append(name)
            os.mkdir(f"busy/d{len(made)}", dir_fd=dir_fd)
            os.close(
                os.open(f"busy/d{len(made)}/f", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=dir_fd)
            )
        rmdir(name, dir_fd=dir_fd)

    monkeypatch.setattr(os, "rmdir", filling_rmdir)
    if refills == ROUNDS:
        assert rmtree(str(tmp_path / "t")) == 2 + 2 * ROUNDS
        assert os.listdir(tmp_path) == []
        return
    with pytest.raises(OSError, match="it kept filling up while being deleted") as refused:
        rmtree(str(tmp_path / "t"))
    assert refused.value.errno == errno.ENOTEMPTY
    assert refused.value.filename == str(tmp_path / "t" / "busy")


def _on_first_parent(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> None:
    """``act`` just before the remover first opens a ``..``."""
    real_open, done = os.open, list[str]()

    def open_(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> int:
        if path == ".." and not done:
            done.append(path)
            act()
        return real_open(path, flags, mode, dir_fd=dir_fd)

    monkeypatch.setattr(os, "open", open_)


def test_a_way_back_up_that_is_gone_starts_again_from_the_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A filesystem may refuse ``..`` of a directory another remover removed: the
    removal starts again from the top, where only what is left is walked."""
    (tmp_path / "t" / "a" / "b").mkdir(parents=True)
    (tmp_path / "t" / "c").mkdir()
    (tmp_path / "t" / "c" / "f").write_bytes(b"")

    def gone() -> None:
        raise FileNotFoundError(errno.ENOENT, "gone", "..")

    _on_first_parent(monkeypatch, gone)
    by_entry(tmp_path / "t")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("by", ["dir", "file"])
def test_a_top_replaced_meanwhile_is_not_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    """Starting again from the top finds another directory, or a file, by that name:
    not the tree asked for, so it stays."""
    (tmp_path / "t" / "a").mkdir(parents=True)

    def replaced() -> None:
        os.rename(tmp_path / "t", tmp_path / "old")
        if by == "dir":
            (tmp_path / "t").mkdir()
            (tmp_path / "t" / "new").write_bytes(b"n")
        else:
            (tmp_path / "t").write_bytes(b"n")
        raise FileNotFoundError(errno.ENOENT, "gone", "..")

    _on_first_parent(monkeypatch, replaced)
    by_path(tmp_path / "t")
    new = tmp_path / "t" / "new" if by == "dir" else tmp_path / "t"
    assert new.read_bytes() == b"n"


def test_a_directory_moved_out_of_the_tree_stops_the_removal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its ``..`` is no longer the directory the removal came down from: ESTALE, and
    nothing outside the tree is removed."""
    (tmp_path / "t" / "a" / "b").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "keep").write_bytes(b"k")

    def moved() -> None:
        os.rename(tmp_path / "t" / "a" / "b", tmp_path / "elsewhere" / "b")

    _on_first_parent(monkeypatch, moved)
    with pytest.raises(OSError, match="moved while it was being walked") as stopped:
        rmtree(str(tmp_path / "t"))
    assert stopped.value.errno == errno.ESTALE
    assert stopped.value.filename == str(tmp_path / "t" / "a" / "b")
    assert (tmp_path / "elsewhere" / "keep").exists()
