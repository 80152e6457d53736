"""The node side of ``storage_filesystem`` without Ray: path confinement, staged
uploads (checked chunks, size check on commit, nothing half-written visible), and
the refusals that protect the disk. The full method contract, across nodes, is in
``tests/cluster/test_node_storage.py``."""

from __future__ import annotations

import os
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import checked_path, storage_path
from air_transfer.core.direct_io import MIN_DIRECT_FILE_BYTES
from air_transfer.errors import ChecksumError
from air_transfer.storage.node_api import ChunkAt, Commit
from air_transfer.storage.server import uploads as disk_uploads
from air_transfer.storage.server.metadata import STAGING_MARK
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
    disk.fs_write(root, ChunkAt(staging, 6), second, chunk_checksum(second))  # out of order
    disk.fs_write(root, ChunkAt(staging, 0), first, chunk_checksum(first))
    assert disk.fs_list(root, root, False, False) == [("f", *disk.fs_info(root, [target])[0])]
    assert Path(target).read_bytes() == b"old"  # nothing visible before the commit
    disk.fs_commit(root, Commit(target, staging, 11, b"!", chunk_checksum(b"!"), 12))
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
        at = ChunkAt(staging, index * chunk, direct_io)
        disk.fs_write(root, at, piece, chunk_checksum(piece))
    tail = body[2 * chunk :]
    disk.fs_commit(
        root, Commit(target, staging, 2 * chunk, tail, chunk_checksum(tail), len(body), direct_io)
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
    disk.fs_commit(root, Commit(target, staging, start, b"de", de, start + 2, expect=expect))
    assert Path(target).read_bytes() == b"abcde"
    assert Path(target).stat().st_mode & 0o777 == 0o600  # the mode is kept


def test_an_altered_chunk_or_a_short_upload_is_not_published(tmp_path: Path) -> None:
    disk, root, target = Disk(), str(tmp_path), str(tmp_path / "f")
    staging, _, _ = disk.fs_open_write(root, target, append=False)
    with pytest.raises(ChecksumError, match="arrived altered"):
        disk.fs_write(root, ChunkAt(staging, 0), b"abcd", chunk_checksum(b"abcX"))
    with pytest.raises(OSError, match=r"incomplete: 0 of 4 bytes"):
        disk.fs_commit(root, Commit(target, staging, 0, b"", chunk_checksum(b""), 4))
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
    commit = Commit(f"{d}/{name}/{name}", staging, 0, b"abc", chunk_checksum(b"abc"), 3)
    disk.fs_commit(root, commit)
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
