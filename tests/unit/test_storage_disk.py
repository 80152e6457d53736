"""The node side of ``storage_filesystem`` without Ray: path confinement, staged
uploads (checked chunks, size check on commit, nothing half-written visible), and
the refusals that protect the disk. The full method contract, across nodes, is in
``tests/cluster/test_node_storage.py``."""

from __future__ import annotations

import os
import posixpath
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import checked_path, storage_path
from air_transfer.core.direct_io import MIN_DIRECT_FILE_BYTES
from air_transfer.errors import ChecksumError
from air_transfer.storage.server import uploads as disk_uploads
from air_transfer.storage.server.metadata import STAGING_MARK
from air_transfer.storage.server.reads import read_chunks
from tests.support.disk import Disk


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/data/exp/ckpt", "/data/exp/ckpt"),
        ("exp/ckpt", "/data/exp/ckpt"),
        ("/data/exp/../x", "/data/x"),
        ("//data//exp/", "/data/exp"),
        ("", "/data"),
        ("/data", "/data"),
    ],
)
def test_storage_path_inside_the_root(path: str, expected: str) -> None:
    assert storage_path("/data", path) == expected


@pytest.mark.parametrize("path", ["/etc/passwd", "/data/../etc", "../x", "/database", "/"])
def test_storage_path_outside_the_root_is_refused(path: str) -> None:
    with pytest.raises(PermissionError, match="outside the storage root '/data'"):
        storage_path("/data", path)


def test_storage_path_bad_input() -> None:
    with pytest.raises(ValueError, match="NUL"):
        storage_path("/", "/a\x00b")
    with pytest.raises(TypeError, match="must be a str"):
        storage_path("/", b"/a")  # type: ignore[arg-type]
    assert storage_path("/", "/../etc") == "/etc"  # the whole disk: nothing is outside


def test_a_symlink_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "out").symlink_to(tmp_path)
    (root / "in").symlink_to(root)
    assert checked_path(str(root), "in/x") == f"{root}/in/x"
    with pytest.raises(PermissionError, match="through a symlink"):
        checked_path(str(root), "out/x")
    with pytest.raises(PermissionError, match="through a symlink"):
        Disk().fs_info(str(root), [f"{root}/out"])


def test_upload_in_chunks_any_order_then_commit(tmp_path: Path) -> None:
    disk, root, target = Disk(), str(tmp_path), str(tmp_path / "f")
    Path(target).write_bytes(b"old")
    staging, start, _ = disk.fs_open_write(root, target, append=False)
    assert start == 0 and STAGING_MARK in staging
    second, first = b"world", b"hello "
    disk.fs_write(root, staging, 6, second, chunk_checksum(second))  # out of order
    disk.fs_write(root, staging, 0, first, chunk_checksum(first))
    assert disk.fs_list(root, root, False, False) == [("f", *disk.fs_info(root, [target])[0])]
    assert Path(target).read_bytes() == b"old"  # nothing visible before the commit
    disk.fs_commit(root, target, staging, 11, b"!", chunk_checksum(b"!"), 12)
    assert Path(target).read_bytes() == b"hello world!"
    assert os.listdir(tmp_path) == ["f"]


@pytest.mark.parametrize("direct_io", [True, False])
def test_large_chunks_upload_the_same_with_or_without_direct_io(
    tmp_path: Path, direct_io: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of ``MIN_DIRECT_FILE_BYTES`` go around the page cache with ``direct_io``
    (aligned, out of order); the unaligned tail through it; the bytes are the same."""
    went_direct: list[bool] = []
    pwrite_direct = disk_uploads.pwrite_direct

    def spy(path: str, data: memoryview, offset: int) -> bool:
        went_direct.append(pwrite_direct(path, data, offset))
        return went_direct[-1]

    monkeypatch.setattr(disk_uploads, "pwrite_direct", spy)
    disk, root, target = Disk(), str(tmp_path), str(tmp_path / "model.bin")
    chunk = MIN_DIRECT_FILE_BYTES
    body = os.urandom(2 * chunk + 4097)
    staging, _, _ = disk.fs_open_write(root, target, append=False)
    for index in (1, 0):
        piece = body[index * chunk : (index + 1) * chunk]
        disk.fs_write(root, staging, index * chunk, piece, chunk_checksum(piece), direct_io)
    tail = body[2 * chunk :]
    disk.fs_commit(
        root, target, staging, 2 * chunk, tail, chunk_checksum(tail), len(body), direct_io
    )
    assert Path(target).read_bytes() == body
    assert os.listdir(tmp_path) == ["model.bin"]
    # Linux's O_DIRECT takes both whole chunks; the tail, and everything without
    # direct_io, goes through the page cache.
    assert went_direct == ([True, True] if direct_io and sys.platform == "linux" else [])


def test_append_starts_after_the_existing_bytes(tmp_path: Path) -> None:
    disk, root, target = Disk(), str(tmp_path), str(tmp_path / "f")
    Path(target).write_bytes(b"abc")
    os.chmod(target, 0o600)
    staging, start, expect = disk.fs_open_write(root, target, append=True)
    de = chunk_checksum(b"de")
    disk.fs_commit(root, target, staging, start, b"de", de, start + 2, expect=expect)
    assert Path(target).read_bytes() == b"abcde"
    assert Path(target).stat().st_mode & 0o777 == 0o600  # the mode is kept


def test_an_altered_chunk_or_a_short_upload_is_not_published(tmp_path: Path) -> None:
    disk, root, target = Disk(), str(tmp_path), str(tmp_path / "f")
    staging, _, _ = disk.fs_open_write(root, target, append=False)
    with pytest.raises(ChecksumError, match="arrived altered"):
        disk.fs_write(root, staging, 0, b"abcd", chunk_checksum(b"abcX"))
    with pytest.raises(OSError, match=r"incomplete: 0 of 4 bytes"):
        disk.fs_commit(root, target, staging, 0, b"", chunk_checksum(b""), 4)
    assert os.listdir(tmp_path) == []  # no target, no staging file left


def test_abort_removes_only_staging_files(tmp_path: Path) -> None:
    disk, root = Disk(), str(tmp_path)
    staging, _, _ = disk.fs_open_write(root, str(tmp_path / "f"), append=False)
    disk.fs_abort(root, staging)
    disk.fs_abort(root, staging)  # twice: fine
    (tmp_path / "keep").write_bytes(b"x")
    with pytest.raises(PermissionError, match="not a staging file"):
        disk.fs_abort(root, str(tmp_path / "keep"))
    assert os.listdir(tmp_path) == ["keep"]


@pytest.mark.parametrize(
    "name", ["n" * 255, "é" * 127 + "a", "😀" * 63 + "abc"], ids=["ascii", "2-byte", "4-byte"]
)
def test_names_of_255_bytes_are_written_and_deleted(tmp_path: Path, name: str) -> None:
    """Defect: the hidden staging and trash names made from a name added 44-45 bytes,
    so that names of 211-255 bytes could not be written, nor directories of 212-255
    deleted (ENAMETOOLONG), where a local filesystem takes them."""
    disk, root, d = Disk(), str(tmp_path), str(tmp_path / name)
    disk.fs_create_dir(root, f"{d}/{name}", True)
    staging, _, _ = disk.fs_open_write(root, f"{d}/{name}/{name}", append=False)
    assert len(os.fsencode(posixpath.basename(staging))) <= 255
    disk.fs_commit(root, f"{d}/{name}/{name}", staging, 0, b"abc", chunk_checksum(b"abc"), 3)
    disk.fs_copy_file(root, f"{d}/{name}/{name}", f"{d}/{name}/c")
    assert Path(d, name, "c").read_bytes() == b"abc"
    disk.fs_delete_dir_contents(root, d, False)
    disk.fs_create_dir(root, f"{d}/{name}", False)
    disk.fs_delete_dir(root, f"{d}/{name}")
    disk.fs_delete_dir(root, d)
    assert os.listdir(tmp_path) == []


def test_the_root_itself_and_slash_are_protected(tmp_path: Path) -> None:
    disk = Disk()
    with pytest.raises(PermissionError, match="storage root"):
        disk.fs_delete_dir(str(tmp_path), str(tmp_path))
    with pytest.raises(PermissionError, match="'/'"):
        disk.fs_delete_dir_contents("/", "/", missing_dir_ok=False)
    assert tmp_path.is_dir()


def test_a_tree_deeper_than_the_recursion_limit_is_listed_and_deleted(tmp_path: Path) -> None:
    """Defect: listing and deletion recursed once per level (RecursionError past
    ~1,000 levels)."""
    disk, root, depth = Disk(), str(tmp_path), sys.getrecursionlimit() + 200
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(depth):  # relative steps: the full path is longer than PATH_MAX
            os.mkdir("d", dir_fd=fd)
            step = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = step
        os.close(os.open("leaf", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
        os.close(fd)
        entries = disk.fs_list(root, f"{root}/d", True, False)
        assert len(entries) == depth  # depth - 1 directories below d, and the leaf
        disk.fs_delete_dir(root, f"{root}/d")
        assert os.listdir(tmp_path) == []
    finally:  # shutil.rmtree (pytest's clean-up) recurses too
        subprocess.run(["rm", "-rf", str(tmp_path / "d")], check=False)


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
                disk.fs_commit(str(root), f"{root}/d/f", staging, 0, b"", chunk_checksum(b""), size)
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
        "fs_write": lambda p: disk.fs_write(r, p, 0, b"x", chunk_checksum(b"x")),
        "fs_commit_path": lambda p: disk.fs_commit(r, p, staging, 0, b"", chunk_checksum(b""), 0),
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
            r, f"{r}/d/secret", staging, 0, b"x", chunk_checksum(b"x"), 1
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
        next(read_chunks(root, fifo, 0, 1 << 20, 0))
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
