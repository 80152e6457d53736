"""O_DIRECT file writing: exact bytes at every alignment, fallback, errors, and which
files the writer sends around the page cache (no Ray)."""

from __future__ import annotations

import errno
import os
import random
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from air_transfer import ChecksumError, TransferConfig
from air_transfer.core import direct_io
from air_transfer.core.direct_io import (
    ALIGN,
    MIN_DIRECT_FILE_BYTES,
    DirectFileWriter,
    should_write_direct,
)
from air_transfer.core.writer import write_tree
from tests.support.packs import local_pack, no_staging_left
from tests.support.trees import assert_same_tree, build_manifest, leftovers, write_file

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT is Linux")

BUFFER = 4 * ALIGN  # small bounce buffers, so a few KiB exercise every hand-off


def write_pieces(path: Path, data: bytes, piece_sizes: list[int]) -> DirectFileWriter:
    writer = DirectFileWriter(str(path), buffer_bytes=BUFFER, depth=2)
    view, sizes = memoryview(data), iter(piece_sizes)
    while view:
        n = next(sizes, len(view))
        writer.write(view[:n])
        view = view[n:]
    writer.close()
    return writer


@linux_only
@pytest.mark.parametrize(
    "length",
    [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, BUFFER - 1, BUFFER, BUFFER + 1, 3 * BUFFER + 777],
)
def test_writes_exactly_the_bytes_at_every_alignment(tmp_path: Path, length: int) -> None:
    data = random.Random(length).randbytes(length)
    writer = write_pieces(tmp_path / "f", data, [1, ALIGN + 3, BUFFER, 5] * 10)
    assert (tmp_path / "f").read_bytes() == data  # size too: the padded tail is cut off
    assert writer.direct  # this test filesystem (the project disk) takes O_DIRECT


@linux_only
def test_writes_on_tmpfs_too(tmp_path: Path) -> None:
    """tmpfs took no O_DIRECT before Linux 6.6: either way the bytes must be right."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = Path("/dev/shm") / f"air-transfer-test-{os.getpid()}"
    data = random.Random(1).randbytes(2 * BUFFER + 11)
    try:
        write_pieces(path, data, [999])
        assert path.read_bytes() == data
    finally:
        path.unlink(missing_ok=True)


@linux_only
def test_a_filesystem_that_refuses_direct_writes_gets_page_cache_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_pwrite, calls = os.pwrite, []

    def refusing_pwrite(fd: int, data: memoryview, offset: int) -> int:
        calls.append(offset)
        if len(calls) == 1:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(fd, data, offset)

    monkeypatch.setattr(direct_io.os, "pwrite", refusing_pwrite)
    data = random.Random(2).randbytes(3 * BUFFER + 5)
    writer = write_pieces(tmp_path / "f", data, [])
    assert (tmp_path / "f").read_bytes() == data
    assert not writer.direct
    assert calls[:2] == [0, 0]  # the refused write was retried, not skipped
    # The fallback is not silent: a warning names the file.
    assert any(
        "refused O_DIRECT" in r.getMessage() and str(tmp_path / "f") in r.getMessage()
        for r in caplog.records
    )


@linux_only
def test_a_failed_write_is_raised_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(fd: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(direct_io.os, "pwrite", full_disk)
    with pytest.raises(OSError, match=r"No space .*writing it after \d+ bytes") as raised:
        write_pieces(tmp_path / "f", bytes(10 * BUFFER), [])
    # the errno survives the hand-off from the writing thread
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(tmp_path / "f"))
    # the failed writer stopped its thread and closed its file by itself
    assert not [t for t in threading.enumerate() if t.name.startswith("air-transfer direct")]


def test_buffer_size_must_be_aligned(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"bounce buffer size 1000 must be .* of {ALIGN}"):
        DirectFileWriter(str(tmp_path / "f"), buffer_bytes=1000)
    assert not (tmp_path / "f").exists()


@linux_only
def test_which_files_go_direct() -> None:
    assert should_write_direct(MIN_DIRECT_FILE_BYTES)
    assert should_write_direct(4 * MIN_DIRECT_FILE_BYTES, enabled=True)
    assert not should_write_direct(MIN_DIRECT_FILE_BYTES - 1)  # a write or two: page cache
    assert not should_write_direct(4 * MIN_DIRECT_FILE_BYTES, enabled=False)


def test_config_takes_only_a_bool() -> None:
    assert TransferConfig().direct_io is True
    assert TransferConfig(direct_io=False).direct_io is False
    with pytest.raises(TypeError, match="direct_io must be a bool, got 'never'"):
        TransferConfig(direct_io="never")  # type: ignore[arg-type]


def big_tree(root: Path) -> Path:
    rng = random.Random(3)
    write_file(root / "model.bin", rng.randbytes(MIN_DIRECT_FILE_BYTES + 4097), 0o600)
    write_file(root / "small.json", b"{}")
    write_file(root / "shards" / "b.bin", rng.randbytes(MIN_DIRECT_FILE_BYTES + 1))
    return root


@linux_only
@pytest.mark.parametrize("direct", [True, False])
def test_write_tree_reproduces_large_files_either_way(tmp_path: Path, direct: bool) -> None:
    src = big_tree(tmp_path / "src")
    manifest, chunks = local_pack(src, chunk_bytes=3 * 1024 * 1024 + 5)
    write_tree(manifest, chunks, tmp_path / "out", direct_io=direct)
    assert_same_tree(src, tmp_path / "out")
    assert no_staging_left(tmp_path)


@linux_only
def test_a_corrupt_chunk_mid_direct_file_publishes_nothing(tmp_path: Path) -> None:
    src = big_tree(tmp_path / "src")
    manifest, chunks = local_pack(src, chunk_bytes=4 * 1024 * 1024)
    chunks[2] = bytes(len(chunks[2]))  # inside model.bin, after two direct writes
    with pytest.raises(ChecksumError, match=r"chunk 2 of .*'model\.bin'"):
        write_tree(manifest, chunks, tmp_path / "out")  # direct_io by default
    assert not (tmp_path / "out").exists()
    assert no_staging_left(tmp_path)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 4 MiB tmpfs, for a real ENOSPC (needs mount privileges: root, as here)."""
    mountpoint = tmp_path / "small"
    mountpoint.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mountpoint)]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a small tmpfs here (not root?)")
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=True)


@linux_only
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "page-cache"])
def test_a_full_disk_raises_enospc_naming_the_file(small_disk: Path, direct: bool) -> None:
    """ENOSPC arrived as an OSError with errno None with direct_io,
    and without a path without it."""
    size = MIN_DIRECT_FILE_BYTES + 1  # 16 MiB: past the 4 MiB disk, and direct
    manifest, chunks = build_manifest({"big.bin": bytes(size)}, chunk_bytes=4 << 20)
    with pytest.raises(OSError) as raised:
        write_tree(manifest, chunks, small_disk / "out", direct_io=direct)
    assert raised.value.errno == errno.ENOSPC
    assert raised.value.filename.endswith("/big.bin")
    assert "No space left on device" in str(raised.value)
    assert os.listdir(small_disk) == []  # staging and lock files gone


@linux_only
@pytest.mark.parametrize("direct", [True, False], ids=["direct", "page-cache"])
def test_a_file_size_limit_raises_efbig_naming_the_file(tmp_path: Path, direct: bool) -> None:
    """The same without privileges: RLIMIT_FSIZE makes writes fail with EFBIG (once
    SIGXFSZ is ignored), on both write paths."""
    size = MIN_DIRECT_FILE_BYTES + 1
    manifest, chunks = build_manifest({"big.bin": bytes(size)}, chunk_bytes=4 << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8 << 20, hard))
    try:
        with pytest.raises(OSError) as raised:
            write_tree(manifest, chunks, tmp_path / "out", direct_io=direct)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
    assert raised.value.errno == errno.EFBIG
    assert raised.value.filename.endswith("/big.bin")
    assert leftovers(tmp_path) == []


def _page_aligned_view(backing: bytearray, length: int) -> memoryview:
    """``length`` bytes of ``backing`` from a page-aligned address: written from in place."""
    address = np.frombuffer(backing, np.uint8).ctypes.data
    start = -address % ALIGN
    return memoryview(backing)[start : start + length]


@linux_only
def test_a_borrowed_buffer_is_free_again_when_write_returns(tmp_path: Path) -> None:
    """A buffer the caller refills after ``write`` (a read-ahead ring) must not be
    written from later: a write still queued from it put the next chunk's bytes into
    the file, unchecked. The bytearray refuses to resize while any view of it lives,
    so this fails whenever the writer still refers to it, however the threads ran."""
    length = 2 * 1024 * 1024
    backing = bytearray(random.Random(1).randbytes(length + ALIGN))
    view = _page_aligned_view(backing, length)
    expected = bytes(view)
    writer = DirectFileWriter(str(tmp_path / "f"))
    assert writer._direct_head(view) == 0  # the in-place path, which queues the view
    writer.write(view)
    view.release()
    backing[:] = bytes(len(backing))  # refilled at once, as the ring does
    backing.extend(b"x")  # BufferError if a queued write still holds a view of it
    writer.close()
    assert writer.direct
    assert (tmp_path / "f").read_bytes() == expected


@linux_only
def test_a_kept_buffer_is_written_from_in_place_after_write_returns(tmp_path: Path) -> None:
    """``kept=True`` (object-store chunks): the view may stay queued; the bytes are
    those of the buffer, which the caller leaves unchanged until ``close``."""
    length = 2 * 1024 * 1024
    backing = bytearray(random.Random(2).randbytes(length + ALIGN))
    view = _page_aligned_view(backing, length)
    writer = DirectFileWriter(str(tmp_path / "f"))
    writer.write(view, kept=True)
    writer.write(view[: ALIGN + 5], kept=True)
    writer.close()
    assert (tmp_path / "f").read_bytes() == bytes(view) + bytes(view[: ALIGN + 5])
