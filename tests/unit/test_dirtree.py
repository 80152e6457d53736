"""Iterative tree walking and removal: any depth, no symlink followed (no Ray)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from air_transfer.core.dirtree import DirCursor, rmtree, walk


def test_rmtree_removes_any_depth_and_read_only_directories(tmp_path: Path) -> None:
    deep = tmp_path / "t"
    deep.mkdir()
    for _ in range(1500):  # past Python's recursion limit (pathlib's mkdir recurses)
        deep = deep / "d"
        deep.mkdir()
    (deep / "f").write_bytes(b"x")
    os.chmod(deep, 0o500)
    os.chmod(tmp_path / "t" / "d", 0o000)
    rmtree(str(tmp_path / "t"))
    assert os.listdir(tmp_path) == []
    rmtree(str(tmp_path / "t"))  # missing: fine


def test_rmtree_never_follows_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "keep").write_bytes(b"k")
    (tmp_path / "t").mkdir()
    os.symlink(tmp_path / "outside", tmp_path / "t" / "link")
    rmtree(str(tmp_path / "t"))
    assert (tmp_path / "outside" / "keep").read_bytes() == b"k"
    os.symlink(tmp_path / "outside", tmp_path / "top_link")
    rmtree(str(tmp_path / "top_link"))  # the link itself goes, not what it points to
    assert (tmp_path / "outside" / "keep").exists() and not (tmp_path / "top_link").exists()


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
