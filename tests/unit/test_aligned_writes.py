"""Positional O_DIRECT reads and writes, what node-storage uploads and reads do
(``pwrite_direct``, ``pread_direct``): whole aligned chunks at their offsets, in
place where the memory allows, declined untouched where O_DIRECT cannot serve, any
other error raised (no Ray)."""

from __future__ import annotations

import errno
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from air_transfer.core import aligned_writes, direct_io
from air_transfer.core.aligned_writes import aligned_buffer, pread_direct
from air_transfer.core.direct_io import ALIGN, pwrite_direct
from tests.support.direct import o_direct_refused

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT is Linux")


@linux_only
def test_pwrite_direct_places_aligned_chunks_in_any_order(tmp_path: Path) -> None:
    """What node-storage uploads do: whole chunks at their offsets, last one first."""
    chunk = direct_io.BOUNCE_BYTES + 2 * ALIGN  # more than one bounce buffer per chunk
    data = random.Random(5).randbytes(3 * chunk)
    path = tmp_path / "f"
    path.touch()
    for index in (2, 0, 1):
        piece = memoryview(data)[index * chunk : (index + 1) * chunk]
        assert pwrite_direct(str(path), piece, index * chunk)
    assert path.read_bytes() == data


@linux_only
def test_pwrite_direct_writes_memory_on_a_page_without_a_bounce_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A chunk whose memory starts on a page (a stored chunk read for reuse) is
    written from where it is; any other through bounce buffers: the same bytes."""
    chunk = direct_io.BOUNCE_BYTES + 2 * ALIGN
    data = np.frombuffer(random.Random(6).randbytes(2 * chunk), np.uint8)
    on_page = aligned_buffer(chunk)
    off_page = aligned_buffer(chunk + 16)[16:]
    on_page[:], off_page[:] = data[:chunk], data[chunk:]
    made: list[int] = []
    real = aligned_writes.aligned_buffer
    monkeypatch.setattr(aligned_writes, "aligned_buffer", lambda n: made.append(n) or real(n))
    path = tmp_path / "f"
    path.touch()
    assert pwrite_direct(str(path), memoryview(on_page), 0)
    assert made == []
    assert pwrite_direct(str(path), memoryview(off_page), chunk)
    assert made == [direct_io.BOUNCE_BYTES]
    assert path.read_bytes() == data.tobytes()


@linux_only
def test_pread_direct_reads_whole_blocks_and_stops_where_the_file_ends(tmp_path: Path) -> None:
    if o_direct_refused(tmp_path):
        pytest.skip("this filesystem takes no O_DIRECT")
    data = random.Random(7).randbytes(3 * ALIGN + 100)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        room = memoryview(aligned_buffer(2 * ALIGN))
        assert pread_direct(fd, ALIGN, room) == 2 * ALIGN
        assert bytes(room) == data[ALIGN : 3 * ALIGN]
        assert pread_direct(fd, 2 * ALIGN, room) == ALIGN + 100  # to the end, not past
        assert bytes(room[: ALIGN + 100]) == data[2 * ALIGN :]
        assert pread_direct(fd, 4 * ALIGN, room) == 0
    finally:
        os.close(fd)


@linux_only
@pytest.mark.parametrize(
    ("offset", "length", "shift"), [(1, ALIGN, 0), (0, 100, 0), (0, ALIGN, 16)]
)
def test_pread_direct_declines_what_is_not_aligned_untouched(
    tmp_path: Path, offset: int, length: int, shift: int
) -> None:
    (tmp_path / "f").write_bytes(b"x" * 2 * ALIGN)
    buffer = aligned_buffer(length + shift)
    buffer[:] = 0
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert pread_direct(fd, offset, memoryview(buffer[shift:])) is None
    finally:
        os.close(fd)
    assert not buffer.any()  # the caller reads it through the page cache


@linux_only
@pytest.mark.parametrize("call", ["open", "preadv"])
def test_pread_direct_declines_where_refused_and_raises_other_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, call: str
) -> None:
    """A filesystem that refuses O_DIRECT (EINVAL, at the open or the read): None,
    read through the page cache; any other error is raised."""
    (tmp_path / "f").write_bytes(b"x" * ALIGN)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    real = getattr(aligned_writes.os, call)

    def failing(errno_: int):
        def fail(*args: Any) -> Any:
            if call == "open" and not args[1] & getattr(os, "O_DIRECT", 0):
                return real(*args)
            raise OSError(errno_, os.strerror(errno_))

        return fail

    try:
        monkeypatch.setattr(aligned_writes.os, call, failing(errno.EINVAL))
        assert pread_direct(fd, 0, memoryview(aligned_buffer(ALIGN))) is None
        monkeypatch.setattr(aligned_writes.os, call, failing(errno.EIO))
        with pytest.raises(OSError) as raised:
            pread_direct(fd, 0, memoryview(aligned_buffer(ALIGN)))
        assert raised.value.errno == errno.EIO
    finally:
        monkeypatch.undo()
        os.close(fd)


@linux_only
@pytest.mark.parametrize(("offset", "length"), [(1, ALIGN), (ALIGN, ALIGN + 1), (0, 100)])
def test_pwrite_direct_declines_unaligned_writes_untouched(
    tmp_path: Path, offset: int, length: int
) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"keep")
    assert not pwrite_direct(str(path), memoryview(bytes(length)), offset)
    assert path.read_bytes() == b"keep"  # the caller writes it through the page cache


@linux_only
def test_pwrite_direct_declines_where_refused_and_raises_other_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "f"
    path.touch()

    def failing(errno_: int):
        def pwrite(fd: int, data: object, offset: int) -> int:
            raise OSError(errno_, os.strerror(errno_))

        return pwrite

    monkeypatch.setattr(direct_io.os, "pwrite", failing(errno.EINVAL))
    assert not pwrite_direct(str(path), memoryview(bytes(ALIGN)), 0)
    monkeypatch.setattr(direct_io.os, "pwrite", failing(errno.ENOSPC))
    with pytest.raises(OSError, match="No space") as raised:
        pwrite_direct(str(path), memoryview(bytes(ALIGN)), 0)
    assert (raised.value.errno, raised.value.filename) == (errno.ENOSPC, str(path))
