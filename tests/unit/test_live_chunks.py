"""The record of live chunks (``transfer.live_chunks``) without Ray: a chunk is found
only for the same spans of files whose stamps are equal in every field, never for a
file without a local identity, and a transfer's records go when it is dropped (a
chunk another transfer recorded too stays). Checksums here are known strings, so
nothing is waited on."""

from __future__ import annotations

from collections.abc import Iterable

import pyarrow.fs as pafs
import pytest

from air_transfer.config import TransferConfig
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.entry import Entry
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.scan import Source, Stamp
from air_transfer.transfer.live_chunks import LiveChunks, chunk_key
from air_transfer.transfer.strategies.base import PackRequest

CHUNK = 1024
CONFIG = TransferConfig(chunk_bytes=CHUNK, owner="node", reuse_chunks=True)
SIZES = (2 * CHUNK, CHUNK + 10, 3 * CHUNK)  # the second file's tail shares a chunk


def request(stamps: dict[int, Stamp] | None = None) -> PackRequest:
    files = tuple(Entry(f"f{i}", "file", size) for i, size in enumerate(SIZES))
    base = [Stamp(size, 5, 6, 100 + i, 7, 1) for i, size in enumerate(SIZES)]
    for i, stamp in (stamps or {}).items():
        base[i] = stamp
    return PackRequest(Source(pafs.LocalFileSystem(), "/x"), files, tuple(base), CONFIG)


class Packer:
    """Stands in for the agent's packing tasks: a fresh object and a checksum per
    chunk, and which chunk indices it was asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __call__(
        self, source: Source, plans: Iterable[ChunkPlan]
    ) -> tuple[list[object], list[str]]:
        plans = list(plans)
        self.asked += [p.index for p in plans]
        return [object() for _ in plans], [chunk_checksum(bytes([p.index])) for p in plans]


def test_the_same_files_unchanged_are_taken_whole() -> None:
    live, packer = LiveChunks(), Packer()
    first = live.reuse(request(), "t1", packer)
    second = live.reuse(request(), "t2", packer)
    assert packer.asked == list(range(7))  # the first transfer only
    assert all(a is b for a, b in zip(first.payload, second.payload, strict=True))
    assert second.checksums == first.checksums and not second.pending
    assert live.chunks_reused == 7 and live.bytes_reused == sum(SIZES)


@pytest.mark.parametrize("field", ["mtime_ns", "ctime_ns", "ino", "dev", "nlink"])
def test_any_field_of_a_stamp_changed_packs_that_files_chunks_again(field: str) -> None:
    live, packer = LiveChunks(), Packer()
    live.reuse(request(), "t1", packer)
    old = request().stamps[1]
    changed = old._replace(**{field: getattr(old, field) + 1})
    packer.asked.clear()
    live.reuse(request({1: changed}), "t2", packer)
    # f1 is chunks 2-3 (3 shares f1's tail and f2's head).
    assert packer.asked == [2, 3]


def test_a_file_without_local_identity_is_never_taken() -> None:
    live, packer = LiveChunks(), Packer()
    remote = {0: Stamp(SIZES[0], 5)}  # what a non-local pyarrow filesystem knows
    assert chunk_key(next(iter(request(remote).plans()))) is None
    live.reuse(request(remote), "t1", packer)
    packer.asked.clear()
    live.reuse(request(remote), "t2", packer)
    assert packer.asked == [0, 1]


def test_a_dropped_transfer_is_not_offered_but_a_chunk_another_recorded_stays() -> None:
    live, packer = LiveChunks(), Packer()
    live.reuse(request(), "t1", packer)
    live.reuse(request({2: Stamp(SIZES[2], 9, 9, 102, 7, 1)}), "t2", packer)  # f2 anew
    live.drop(["t1"])
    assert live.held() == 1
    packer.asked.clear()
    live.reuse(request(), "t3", packer)
    # t2 recorded f0, f1 (taken from t1) and its own f2: t1's f2 chunks are gone.
    assert packer.asked == [3, 4, 5, 6]
    live.drop(["t2", "t3", "never"])
    assert live.held() == 0


def test_a_released_lease_is_listed_until_its_chunks_are_dropped() -> None:
    """The agent answers ``leases`` and ``release`` on different threads: a lease no
    longer listed must have no chunk left to offer, so ``release`` drops the chunks
    while the lease is still listed, never after it is gone."""
    from air_transfer.transfer.node_owned import NodeOwnedTransfers

    held = NodeOwnedTransfers()
    held.live.reuse(request(), "t1", Packer())
    held._leases["k1"] = (None, None, "t1")  # type: ignore[assignment]  # no Ray: a bare lease
    listed_while_dropping: list[bool] = []
    drop = held.live.drop

    def drop_and_look(transfer_ids: Iterable[str]) -> None:
        listed_while_dropping.append("k1" in held.leases())
        drop(transfer_ids)

    held.live.drop = drop_and_look  # type: ignore[method-assign]
    held.release("k1", "unknown")
    assert listed_while_dropping == [True]
    assert held.leases() == {} and held.live.held() == 0
