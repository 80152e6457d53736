"""Mapped packing (``core.mapped``, ``core.packer``): a chunk of one large local file
is a view of the file mapped under a read lease, with the checksum of exactly the
bytes handed out; the lease lasts as long as the views; a lease the kernel refuses
(a writer has the file open) falls back to reading, still proven; a truncate by
another process while a chunk is mapped, however long the packer stalls, goes
through once the views are private copies, never crashing the packer (SIGBUS)."""

from __future__ import annotations

import errno
import gc
import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from air_transfer import SourceChangedError
from air_transfer.config import MiB
from air_transfer.core import lease_breaks, mapped, packer
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.mapped import is_mapped
from air_transfer.core.packer import ChunkPacker
from air_transfer.core.plan import ChunkPlan, Span, plan_chunks
from tests.support.leases import (
    STALL_S,
    hold_open_for_write,
    leased,
    mapped_here,
    truncate_now,
    truncated_while_stalled,
)
from tests.support.rewriters import CHANGED, HOW, local_scan, rewrite
from tests.support.waiting import eventually

CHUNK = 1 * MiB


def make_source(tmp_path: Path) -> Path:
    """``w.bin`` spans chunks 0-2 (its last one shared with ``z.txt``)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(2 * CHUNK + 4096 + 7))
    (src / "z.txt").write_bytes(b"small" * 10)
    return src


def pack(src: Path) -> tuple[list[np.ndarray], list[str], bytes]:
    source, scanned = local_scan(src)
    plans = list(plan_chunks(scanned.files, scanned.stamps, CHUNK))
    chunks, checksums = ChunkPacker().pack(source, plans)
    expected = b"".join(p.read_bytes() for p in (src / "w.bin", src / "z.txt"))
    return chunks, checksums, expected


def assert_packed(chunks: list[np.ndarray], checksums: list[str], expected: bytes) -> None:
    assert b"".join(bytes(c) for c in chunks) == expected
    assert checksums == [chunk_checksum(bytes(c)) for c in chunks]


def test_one_file_chunks_are_mapped_and_leased_while_their_views_live(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    chunks, checksums, expected = pack(src)
    assert [is_mapped(c) for c in chunks] == [True, True, False]
    assert_packed(chunks, checksums, expected)
    assert not chunks[0].flags.writeable
    assert leased(src / "w.bin")
    del chunks
    gc.collect()
    assert not leased(src / "w.bin")


def test_a_lease_refused_to_a_file_open_for_writing_falls_back_to_reading(
    tmp_path: Path, in_driver: Callable[[Any], None]
) -> None:
    src = make_source(tmp_path)
    writer = hold_open_for_write(src / "w.bin")
    try:
        chunks, checksums, expected = pack(src)
        assert not any(is_mapped(c) for c in chunks)
        assert_packed(chunks, checksums, expected)
        # Read, not mapped, so a rewrite while packed is still caught by the stamps.
        fired: list[str] = []

        def rewrite_once(where: str, span: Span) -> None:
            if not fired:
                fired.append(where)
                rewrite(where, "in-place")

        in_driver(rewrite_once)
        with pytest.raises(SourceChangedError, match=CHANGED):
            pack(src)
        assert fired == [str(src / "w.bin")]
    finally:
        writer.communicate("")


@pytest.mark.parametrize("how", HOW)
def test_a_rewrite_of_a_file_being_mapped_is_caught_by_the_stamps(
    tmp_path: Path, in_driver: Callable[[Any], None], how: str
) -> None:
    """The packing seam runs before the file is leased (a rewrite there does not wait
    for it); the stamps taken under the lease then see the rewrite."""
    src = make_source(tmp_path)
    in_driver(lambda where, span: span.file_offset == 0 and rewrite(where, how))
    with pytest.raises(SourceChangedError, match=CHANGED):
        pack(src)


def test_a_packer_stalled_with_a_chunk_mapped_lets_a_truncate_through_unharmed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The packer stalls once a chunk is mapped, before hashing it, until another
    process's truncate has gone through (longer than the kernel's lease-break-time
    would revoke the lease, in effect): the lease is handed back on the break, its
    mapping replaced by a private copy first, so the hash that follows reads the
    version scanned, not a truncated file (SIGBUS), and the stamps taken with the
    copy prove it. The code before kept the lease: the truncate waited for it."""
    src = make_source(tmp_path)
    path = str(src / "w.bin")
    expected = (src / "w.bin").read_bytes()[:CHUNK]
    source, scanned = local_scan(src)
    plans = list(plan_chunks(scanned.files, scanned.stamps, CHUNK))
    fired: list[str] = []

    def stall(where: str, span: Span) -> None:
        if not fired:
            fired.append(where)
            truncated_while_stalled(where)

    monkeypatch.setattr(packer, "_while_mapped", stall)
    (chunk,), (checksum,) = ChunkPacker().pack(source, plans[:1])
    assert fired == [path] and os.path.getsize(path) == 0
    assert is_mapped(chunk) and not mapped_here(path)  # a private copy at its address
    assert bytes(chunk) == expected and checksum == chunk_checksum(expected)
    # The next chunk of the file is read, and sees the truncate.
    with pytest.raises(SourceChangedError, match="shrank"):
        ChunkPacker().pack(source, plans[1:2])


def test_views_handed_out_keep_the_scanned_bytes_when_the_file_is_truncated(
    tmp_path: Path,
) -> None:
    """The views outlive the packing call (Ray's copy into a full store may wait):
    a truncate by another process goes through at once, and the views still hold
    the bytes packed, from private copies, the file no longer mapped."""
    src = make_source(tmp_path)
    path = str(src / "w.bin")
    chunks, checksums, expected = pack(src)
    assert [is_mapped(c) for c in chunks] == [True, True, False] and mapped_here(path)
    signals = lease_breaks.signals_taken()
    truncated_while_stalled(path)
    assert lease_breaks.signals_taken() > signals  # answered on its signal, not polled
    assert not mapped_here(path) and not leased(src / "w.bin")
    assert_packed(chunks, checksums, expected)
    assert not chunks[0].flags.writeable
    del chunks
    gc.collect()
    (tmp_path / "again").mkdir()
    assert_packed(*pack(make_source(tmp_path / "again")))  # the process packs on


def test_a_view_read_by_another_thread_during_the_hand_back_reads_the_scanned_bytes(
    tmp_path: Path,
) -> None:
    """Another thread hashes a 64 MiB view over and over (releasing the GIL, as
    Ray's copy threads do) while this one truncates the file: the private copy takes
    the mapping's place under the address-space lock, so every pass reads the
    scanned bytes, passes that spanned the whole hand-back included (counted: they
    must have happened, in at most a few tries)."""
    spanning, passes = 0, 0
    for attempt in range(5):
        (tmp_path / str(attempt)).mkdir()
        reads = read_while_truncated(tmp_path / str(attempt))
        assert all(same for *_, same in reads)
        passes += len(reads)
        spanning += sum(1 for started, ended, _ in reads if started < 2 and ended == 2)
        if spanning:
            break
    assert spanning > 0, f"no pass of {passes} spanned a hand-back"


def read_while_truncated(root: Path) -> list[tuple[int, int, bool]]:
    """Each pass of a thread hashing a mapped 64 MiB view while this one truncates
    its file: (phase at its start, at its end, whether it read the scanned bytes);
    phase 0: leased; 1: breaking; 2: truncated."""
    src = make_source(root)
    data = os.urandom(64 * MiB)
    (src / "w.bin").write_bytes(data)
    (src / "z.txt").unlink()
    source, scanned = local_scan(src)
    plans = list(plan_chunks(scanned.files, scanned.stamps, 64 * MiB))
    (chunk,), _ = ChunkPacker().pack(source, plans)
    want = hashlib.sha256(data).digest()
    phase, stop, reads = [0], threading.Event(), []

    def reader() -> None:
        while not stop.is_set():
            started = phase[0]
            same = hashlib.sha256(chunk).digest() == want
            reads.append((started, phase[0], same))

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        eventually(lambda: reads, "a first pass", interval_s=0)
        phase[0] = 1  # the first try starts the break; one goes through once answered
        eventually(lambda: truncate_now(src / "w.bin"), "the truncate", STALL_S, 0)
        phase[0] = 2
        eventually(lambda: reads[-1][1] == 2, "a pass after the truncate", interval_s=0)
    finally:
        stop.set()
        thread.join()
    return reads


def test_a_chunk_stored_by_a_stalled_store_is_the_version_scanned(tmp_path: Path) -> None:
    """``store_each`` hands the mapped view to a store that stalls until another
    process's truncate went through, then copies it: the scanned bytes."""
    src = make_source(tmp_path)
    path = str(src / "w.bin")
    expected = (src / "w.bin").read_bytes()[:CHUNK]
    source, scanned = local_scan(src)
    plans = list(plan_chunks(scanned.files, scanned.stamps, CHUNK))

    def stalled_store(view: np.ndarray) -> bytes:
        assert is_mapped(view)
        truncated_while_stalled(path)
        return bytes(view)

    [(stored, checksum)] = ChunkPacker().store_each(source, plans[:1], stalled_store)
    assert stored == expected and checksum is None


def test_a_chunk_of_a_file_that_shrank_before_it_was_mapped_is_refused(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    source, scanned = local_scan(src)
    plans: list[ChunkPlan] = list(plan_chunks(scanned.files, scanned.stamps, CHUNK))
    os.truncate(src / "w.bin", CHUNK)
    with pytest.raises(SourceChangedError, match="shrank"):
        ChunkPacker().pack(source, plans[1:2])
    assert not leased(src / "w.bin")


def test_an_inline_stream_of_one_file_is_one_mapped_view(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    source, scanned = local_scan(src)
    plans = list(plan_chunks(scanned.files, scanned.stamps, CHUNK))
    stream, checksums = ChunkPacker().pack_stream(source, plans)  # two files: read
    assert not is_mapped(stream) and bytes(stream) == pack(src)[2]
    (src / "z.txt").unlink()
    source, scanned = local_scan(src)
    plans = list(plan_chunks(scanned.files, scanned.stamps, CHUNK))
    stream, checksums = ChunkPacker().pack_stream(source, plans)
    data = (src / "w.bin").read_bytes()
    assert is_mapped(stream) and bytes(stream) == data
    starts = range(0, len(data), CHUNK)
    assert checksums == [chunk_checksum(data[i : i + CHUNK]) for i in starts]


def test_a_filesystem_that_cannot_map_the_file_falls_back_to_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_mmap(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(mapped.FileReadLease, "view", no_mmap)
    src = make_source(tmp_path)
    chunks, checksums, expected = pack(src)
    assert not any(is_mapped(c) for c in chunks)
    assert_packed(chunks, checksums, expected)
    assert not leased(src / "w.bin")
