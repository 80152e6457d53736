"""Iterative tree walking: any depth, no symlink followed (no Ray). Removal:
``test_remove_tree``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from air_transfer.core.dirtree import DirCursor, Level, Loop, walk, walk_dirs


def test_walk_visits_everything_once_and_ends_where_it_started(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_bytes(b"")
    (tmp_path / "g").write_bytes(b"")
    os.symlink("a", tmp_path / "l")
    with DirCursor(str(tmp_path)) as cursor:
        start = os.fstat(cursor.fd).st_ino
        events = sorted((v.event, v.relpath, v.kind) for v in walk(cursor))
        assert os.fstat(cursor.fd).st_ino == start
    assert events == [
        ("enter", "a", "dir"), ("enter", "a/b", "dir"),
        ("entry", "a/b/f", "file"), ("entry", "g", "file"), ("entry", "l", "symlink"),
        ("leave", "a", "dir"), ("leave", "a/b", "dir"),
    ]  # fmt: skip


def test_a_followed_symlink_is_walked_and_one_back_to_an_ancestor_is_a_loop(
    tmp_path: Path,
) -> None:
    """``follow`` during a symlink's step walks the directory it leads to, in name
    order, and comes back to the link's directory through ``reopen_parent``; a
    link leading to a directory already on the way down raises ``Loop``."""
    (tmp_path / "t" / "a").mkdir(parents=True)
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / "x" / "y" / "f").touch()
    (tmp_path / "t" / "a" / "z").touch()
    os.symlink(tmp_path / "x", tmp_path / "t" / "a" / "l")
    os.symlink(tmp_path / "t", tmp_path / "t" / "a" / "up")
    reopened: list[str] = []

    def reopen(path: Path) -> int:
        reopened.append(path.name)
        return _open(path)

    steps = []
    with DirCursor(str(tmp_path / "t")) as cursor:
        start = os.fstat(cursor.fd).st_ino
        visits = walk(cursor, ordered=True)
        for v in visits:
            steps.append((v.event, v.relpath))
            if v.event == "entry" and v.name == "l":
                cursor.follow("l", _open(tmp_path / "x"), lambda: reopen(tmp_path / "t" / "a"))
            if v.event == "entry" and v.name == "up":
                with pytest.raises(Loop, match="reached again"):
                    cursor.follow("up", _open(tmp_path / "t"), lambda: _open(tmp_path / "t" / "a"))
        assert os.fstat(cursor.fd).st_ino == start
    assert steps == [
        ("enter", "a"), ("entry", "a/l"), ("enter", "a/l/y"), ("entry", "a/l/y/f"),
        ("leave", "a/l/y"), ("leave", "a/l"), ("entry", "a/up"), ("entry", "a/z"),
        ("leave", "a"),
    ]  # fmt: skip
    assert reopened == ["a"]


def test_a_tree_moved_while_walked_stops_the_walk(tmp_path: Path) -> None:
    (tmp_path / "t" / "a" / "b").mkdir(parents=True)
    (tmp_path / "t" / "a" / "b" / "f").touch()
    (tmp_path / "elsewhere").mkdir()
    with DirCursor(str(tmp_path / "t")) as cursor:
        visits = walk(cursor)
        for v in visits:
            if v.relpath == "a/b/f":
                break
        # the walk is in "b" now: move it under another parent before it goes up
        os.rename(tmp_path / "t" / "a" / "b", tmp_path / "elsewhere" / "b")
        with pytest.raises(OSError, match="moved while it was being walked"):
            list(visits)


def _open(path: Path) -> int:
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY)


def test_walk_dirs_lists_every_level_and_closes_them(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "c").mkdir()
    os.symlink(tmp_path / "a", tmp_path / "link")
    seen: list[tuple[str, str]] = []
    fds: list[int] = []

    def visit(level: Level) -> list[str]:
        fds.append(level.fd)
        seen.append((level.rel, level.name))
        return sorted(
            (e.name for e in os.scandir(level.fd) if e.is_dir(follow_symlinks=False)),
            reverse=True,
        )

    walk_dirs(Level(_open(tmp_path), -1, "", ""), visit)
    assert seen == [("", ""), ("a/", "a"), ("a/b/", "b"), ("c/", "c")]
    for fd in fds:
        with pytest.raises(OSError):
            os.fstat(fd)  # every level closed


def test_walk_dirs_skips_what_vanished_and_walks_again_what_leave_returns(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "f").write_bytes(b"x")
    seen: list[str] = []
    leaves: list[str] = []

    def visit(level: Level) -> list[str]:
        seen.append(level.rel)
        return ["gone", "f", "a"] if level.rel == "" else []  # "f": not a directory

    def leave(level: Level) -> list[str] | None:
        leaves.append(level.rel)
        if level.rel == "" and leaves.count("") == 1:
            return ["a"]  # appeared meanwhile: walked, then left again
        return None

    walk_dirs(Level(_open(tmp_path), -1, "", ""), visit, leave)
    assert seen == ["", "a/", "a/"]
    assert leaves == ["a/", "", "a/", ""]
