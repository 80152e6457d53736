"""The consumer's one pass: a view that is aligned as ``O_DIRECT`` needs is written
from where it is (the object store's memory), any other through the bounce buffers,
hashed piece by piece right after each copy; either way the hash is of every byte
written, and a corrupt chunk of a large file is caught before anything is published
(no Ray)."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from air_transfer import ChecksumError
from air_transfer.config import MiB
from air_transfer.core.aligned_writes import aligned_buffer
from air_transfer.core.checksum import chunk_checksum, chunk_hasher
from air_transfer.core.direct_io import ALIGN, MEM_ALIGN, MIN_DIRECT_FILE_BYTES, DirectFileWriter
from air_transfer.core.writer import write_tree
from tests.support.packs import local_pack, no_staging_left

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="O_DIRECT is Linux")

LENGTH = 3 * MiB + 5  # an unaligned tail too


def view_at(shift: int, data: bytes) -> np.ndarray:
    """``data`` in memory starting ``shift`` bytes past a page boundary."""
    raw = aligned_buffer(len(data) + ALIGN)
    raw[shift : shift + len(data)] = np.frombuffer(data, np.uint8)
    return raw[shift : shift + len(data)]


def spied_pwrite(
    monkeypatch: pytest.MonkeyPatch, source: np.ndarray, refuse: bool = False
) -> list[bool]:
    """Record, for every ``pwrite``, whether it wrote from ``source``'s own memory
    (with ``refuse``, such a write fails as a kernel refusing its address would)."""
    real = os.pwrite
    lo = source.ctypes.data
    hi = lo + len(source)
    from_source: list[bool] = []

    def pwrite(fd: int, data: Any, offset: int) -> int:
        inside = lo <= np.frombuffer(data, np.uint8).ctypes.data < hi
        from_source.append(inside)
        if inside and refuse:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(os, "pwrite", pwrite)
    return from_source


def write_hashed(path: Path, view: np.ndarray, before: bytes = b"") -> str:
    hasher = chunk_hasher()
    writer = DirectFileWriter(str(path))
    if before:
        writer.write(memoryview(before), hasher)
    writer.write(memoryview(view), hasher)
    writer.close()
    assert writer.direct
    digest: str = hasher.hexdigest()
    return digest


@pytest.mark.parametrize("shift", [0, MEM_ALIGN, 3 * MEM_ALIGN])
def test_an_aligned_view_is_written_from_where_it_is_and_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: int
) -> None:
    data = os.urandom(LENGTH)
    view = view_at(shift, data)
    from_source = spied_pwrite(monkeypatch, view)
    assert write_hashed(tmp_path / "f", view) == chunk_checksum(data)
    assert (tmp_path / "f").read_bytes() == data
    assert any(from_source)


def test_a_view_after_an_unaligned_head_is_written_from_where_it_lines_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """100 bytes written before: the view's first ALIGN - 100 bytes are bounced, the
    rest goes from the view if its address lines up with the file offset."""
    head, data = os.urandom(100), os.urandom(LENGTH)
    view = view_at(ALIGN - (ALIGN - 100), data)  # view[ALIGN - 100:] is page aligned
    from_source = spied_pwrite(monkeypatch, view)
    assert write_hashed(tmp_path / "f", view, head) == chunk_checksum(head + data)
    assert (tmp_path / "f").read_bytes() == head + data
    assert any(from_source)


@pytest.mark.parametrize("shift", [64, MEM_ALIGN + 64, 1])
def test_a_misaligned_view_goes_through_the_bounce_buffers_and_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: int
) -> None:
    data = os.urandom(LENGTH)
    view = view_at(shift, data)
    from_source = spied_pwrite(monkeypatch, view)
    assert write_hashed(tmp_path / "f", view) == chunk_checksum(data)
    assert (tmp_path / "f").read_bytes() == data
    assert from_source and not any(from_source)


def test_a_view_whose_address_the_kernel_refuses_is_bounced_instead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(LENGTH)
    view = view_at(MEM_ALIGN, data)
    spied_pwrite(monkeypatch, view, refuse=True)
    assert write_hashed(tmp_path / "f", view) == chunk_checksum(data)
    assert (tmp_path / "f").read_bytes() == data


def big_source(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.txt").write_bytes(b"small")  # shifts the large file off alignment
    (src / "big.bin").write_bytes(os.urandom(MIN_DIRECT_FILE_BYTES + 3 * MiB))
    return src


#: Where chunks sit in memory: ``big.bin`` (after the 5 bytes of ``a.txt``) lines up
#: with its file offsets at ALIGN - 5, so it goes direct from the chunks; at 64 not.
SHIFTS = [ALIGN - 5, 64]


@pytest.mark.parametrize("shift", SHIFTS)
@pytest.mark.parametrize("bad", [0, 2])
def test_a_corrupt_chunk_of_a_direct_file_is_caught_and_nothing_published(
    tmp_path: Path, shift: int, bad: int
) -> None:
    src = big_source(tmp_path)
    manifest, chunks = local_pack(src, chunk_bytes=8 * MiB)
    corrupt = bytearray(chunks[bad])
    corrupt[-3] ^= 0x01
    chunks[bad] = bytes(corrupt)
    views = [view_at(shift, c) for c in chunks]
    with pytest.raises(ChecksumError, match=rf"chunk {bad} of 3 .*'big.bin'"):
        write_tree(manifest, views, tmp_path / "out")
    assert not (tmp_path / "out").exists() and no_staging_left(tmp_path)


@pytest.mark.parametrize("shift", SHIFTS)
def test_a_large_file_from_aligned_or_misaligned_views_is_rebuilt(
    tmp_path: Path, shift: int
) -> None:
    src = big_source(tmp_path)
    manifest, chunks = local_pack(src, chunk_bytes=8 * MiB)
    write_tree(manifest, [view_at(shift, c) for c in chunks], tmp_path / "out")
    assert (tmp_path / "out" / "big.bin").read_bytes() == (src / "big.bin").read_bytes()
    assert (tmp_path / "out" / "a.txt").read_bytes() == b"small"
