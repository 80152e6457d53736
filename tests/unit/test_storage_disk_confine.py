"""Node storage on the storage node, without Ray: every path the agent is given is
confined to the root, and a directory swapped for a symlink after a check is not
followed."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import storage_path
from air_transfer.storage.node_api import ChunkAt, Commit
from air_transfer.storage.server.metadata import STAGING_MARK
from air_transfer.storage.server.reads import read_stored_chunks
from tests.support.disk import Disk


# -- confinement: every path the agent is given ---------------------------------------
@pytest.fixture
def jail(tmp_path: Path) -> tuple[Path, Path]:
    """A storage root holding ``d/f``, ``link -> outside``, and an ``outside``
    directory next to it holding ``secret``, a staging-named file and ``sub/``."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"inside")
    outside.mkdir()
    (outside / "secret").write_bytes(b"outside")
    (outside / f".secret{STAGING_MARK}x").write_bytes(b"outside")
    (outside / "sub").mkdir()
    (outside / "sub" / "secret").write_bytes(b"outside")
    (root / "link").symlink_to(outside)
    return root, outside


def untouched(outside: Path) -> bool:
    files = [f".secret{STAGING_MARK}x", "secret", "sub/secret"]
    return sorted(str(p.relative_to(outside)) for p in outside.rglob("*")) == sorted(
        [*files, "sub"]
    ) and all((outside / f).read_bytes() == b"outside" for f in files)


def escapes(root: Path, outside: Path, name: str) -> list[str]:
    """Ways to name ``outside/name`` from ``root``: absolute, dot-dot, relative,
    and through the symlink."""
    return [
        str(outside / name),
        f"{root}/../outside/{name}",
        f"../outside/{name}",
        f"{root}/link/{name}",
    ]


def test_commit_confines_its_staging_path(jail: tuple[Path, Path]) -> None:
    """Defect: ``fs_commit`` did not confine its staging path: given one outside
    the root it renamed that file over the target, or (size mismatch) deleted it."""
    (root, outside), disk = jail, Disk()
    for staging in escapes(root, outside, f".secret{STAGING_MARK}x"):
        for size in (7, 8):  # the size the file has (a rename), and not (a delete)
            with pytest.raises(PermissionError):
                commit = Commit(f"{root}/d/f", staging, 0, b"", chunk_checksum(b""), size)
                disk.fs_commit(str(root), commit)
    assert untouched(outside) and (root / "d" / "f").read_bytes() == b"inside"


@pytest.mark.parametrize(
    "op",
    [
        "fs_info", "fs_list", "fs_create_dir", "fs_delete_dir", "fs_delete_dir_contents",
        "fs_delete_file", "fs_move_src", "fs_move_dest", "fs_copy_file_src",
        "fs_copy_file_dest", "fs_open_write", "fs_write", "fs_commit_path", "fs_abort",
    ],
)  # fmt: skip
def test_every_operation_confines_every_path(jail: tuple[Path, Path], op: str) -> None:
    (root, outside), disk, r = jail, Disk(), str(jail[0])
    staging, _, _ = disk.fs_open_write(r, f"{r}/d/new", append=False)
    calls: dict[str, Callable[[str], object]] = {
        "fs_info": lambda p: disk.fs_info(r, [p]),
        "fs_list": lambda p: disk.fs_list(r, p, True, False),
        "fs_create_dir": lambda p: disk.fs_create_dir(r, p + "/x", True),
        "fs_delete_dir": lambda p: disk.fs_delete_dir(r, p),
        "fs_delete_dir_contents": lambda p: disk.fs_delete_dir_contents(r, p, False),
        "fs_delete_file": lambda p: disk.fs_delete_file(r, p),
        "fs_move_src": lambda p: disk.fs_move(r, p, f"{r}/d/moved"),
        "fs_move_dest": lambda p: disk.fs_move(r, f"{r}/d/f", p),
        "fs_copy_file_src": lambda p: disk.fs_copy_file(r, p, f"{r}/d/copy"),
        "fs_copy_file_dest": lambda p: disk.fs_copy_file(r, f"{r}/d/f", p),
        "fs_open_write": lambda p: disk.fs_open_write(r, p, True),
        "fs_write": lambda p: disk.fs_write(r, ChunkAt(p, 0), b"x", chunk_checksum(b"x")),
        "fs_commit_path": lambda p: disk.fs_commit(
            r, Commit(p, staging, 0, b"", chunk_checksum(b""), 0)
        ),
        "fs_abort": lambda p: disk.fs_abort(r, p),
    }
    name = {"fs_write": f".secret{STAGING_MARK}x", "fs_abort": f".secret{STAGING_MARK}x"}.get(
        op, "sub" if "dir" in op or op == "fs_list" else "secret"
    )
    for path in escapes(root, outside, name):
        with pytest.raises(PermissionError):
            calls[op](path)
        assert untouched(outside), f"{op}({path!r}) touched a file outside the root"
    assert (root / "d" / "f").read_bytes() == b"inside"


@pytest.mark.parametrize("op", ["delete_file", "write", "create_dir", "move", "info"])
def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    jail: tuple[Path, Path], op: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect (TOCTOU): a path was checked (its real path inside the root), then used
    by name; a directory on the way replaced by a symlink out of the root in
    between led the operation outside. Here the swap happens right after the path's
    first resolution, the worst moment: the operation must refuse, touching nothing
    outside."""
    (root, outside), disk, r = jail, Disk(), str(jail[0])
    (root / "d" / "secret").write_bytes(b"inside")
    (root / "d" / "sub").mkdir()
    staging, _, _ = disk.fs_open_write(r, f"{r}/d/secret", append=False)
    realpath = os.path.realpath
    swapped: list[str] = []

    def resolve_then_swap(path: Any, *args: Any, **kwargs: Any) -> str:
        real = realpath(path, *args, **kwargs)
        if not swapped and str(path).startswith(f"{r}/d"):
            swapped.append(str(path))
            os.rename(root / "d", root / "d.old")
            (root / "d").symlink_to(outside)
        return real

    monkeypatch.setattr(os.path, "realpath", resolve_then_swap)
    calls: dict[str, Callable[[], object]] = {
        "delete_file": lambda: disk.fs_delete_file(r, f"{r}/d/secret"),
        "write": lambda: disk.fs_commit(
            r, Commit(f"{r}/d/secret", staging, 0, b"x", chunk_checksum(b"x"), 1)
        ),
        "create_dir": lambda: disk.fs_create_dir(r, f"{r}/d/sub/x", False),
        "move": lambda: disk.fs_move(r, f"{r}/d/secret", f"{r}/moved"),
        "info": lambda: disk.fs_info(r, [f"{r}/d/secret"]),
    }
    with pytest.raises(PermissionError):
        calls[op]()
    assert swapped and untouched(outside)


def test_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    """Opening a FIFO for reading blocks until a writer comes: an agent thread would
    hang on one (put there, or swapped in after ``fs_info`` said it was a file)."""
    disk, root, fifo = Disk(), str(tmp_path), str(tmp_path / "fifo")
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="not a regular file"):
        next(read_stored_chunks(root, fifo, 0, 1 << 20, 0))
    with pytest.raises(OSError, match="not a regular file"):
        disk.fs_copy_file(root, fifo, f"{root}/copy")
    assert sorted(os.listdir(tmp_path)) == ["fifo"]


def test_a_root_given_with_a_trailing_slash(tmp_path: Path) -> None:
    """The agent takes the root from its caller, who may not have normalised it."""
    disk, root = Disk(), f"{tmp_path}/"
    assert storage_path(root, f"{tmp_path}/x") == f"{tmp_path}/x"
    disk.fs_create_dir(root, f"{tmp_path}/x", False)
    assert disk.fs_info(root, [f"{tmp_path}/x"])[0][0] == pafs.FileType.Directory


def test_delete_dir_contents_leaves_another_callers_trash_to_it(tmp_path: Path) -> None:
    """Defect: concurrent delete_dir_contents renamed each other's trash directories
    again and again (``.s0.air-trash-<id>.air-trash-<id>...``) until a name passed 255
    bytes and a caller failed with ENAMETOOLONG. A trash directory is being removed by
    the caller that made it: the others leave it alone."""
    root = str(tmp_path)
    trash = tmp_path / "x" / ".s0.air-trash-0123456789abcdef0123456789abcdef"
    (trash / "t").mkdir(parents=True)
    (tmp_path / "x" / "f").write_bytes(b"x")
    Disk().fs_delete_dir_contents(root, str(tmp_path / "x"), False)
    assert os.listdir(tmp_path / "x") == [trash.name]
    assert (trash / "t").is_dir()
