"""The storage node's cache of file chunks (``storage.server.chunk_cache``) without
Ray: each chunk of one version of a file is packed once, kept under the readers' byte
budget, dropped when idle, and a new version of the file is packed anew; a checkpoint
directory's transfer is shared by every reader in flight, whatever its size."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from air_transfer.config import TransferConfig
from air_transfer.core.packer import ChunkPacker
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.scan import Source
from air_transfer.storage.server import chunk_cache
from air_transfer.storage.server.chunk_cache import FileChunks
from air_transfer.storage.server.directory_transfers import DirectoryTransfers

CHUNK = 1024


class Packer:
    """Packs in this process what the agent would pack in its own tasks, recording
    which chunks it was asked for."""

    def __init__(self) -> None:
        self.asked: list[int] = []

    def __call__(self, source: Source, plans: Iterable[ChunkPlan]) -> tuple[list[Any], list[Any]]:
        plans = list(plans)
        self.asked += [p.index for p in plans]
        chunks, checksums = ChunkPacker().pack(source, plans)
        return [bytes(c) for c in chunks], checksums


@pytest.fixture
def stored(tmp_path: Path) -> tuple[Path, bytes]:
    body = os.urandom(5 * CHUNK + 7)
    (tmp_path / "f").write_bytes(body)
    return tmp_path, body


def test_each_chunk_is_packed_once_and_served_to_every_reader(stored: tuple[Path, bytes]) -> None:
    root, body = stored
    packer = Packer()
    cache = FileChunks(packer)
    for _ in range(3):  # three readers, each asking for the file in two batches
        pairs = cache.refs(str(root), "f", len(body), CHUNK, 0, 4, 1 << 20)
        pairs += cache.refs(str(root), "f", len(body), CHUNK, 4, 4, 1 << 20)
        assert b"".join(chunk for chunk, _ in pairs) == body
    assert packer.asked == list(range(6))
    counters = cache.counters()
    assert counters["bytes_read"] == len(body) and counters["bytes_served"] == 3 * len(body)
    assert counters["hits"] == 12 and counters["bytes_held"] == len(body)


def test_the_budget_keeps_the_most_recently_used_chunks(stored: tuple[Path, bytes]) -> None:
    root, body = stored
    packer = Packer()
    cache = FileChunks(packer)
    cache.refs(str(root), "f", len(body), CHUNK, 0, 6, 2 * CHUNK)
    assert cache.counters()["bytes_held"] <= 2 * CHUNK
    packer.asked.clear()
    cache.refs(str(root), "f", len(body), CHUNK, 0, 6, 2 * CHUNK)
    assert packer.asked == [0, 1, 2, 3]  # 4 and 5 (7 bytes) were the ones kept


def test_what_a_node_keeps_is_capped_by_its_object_store_whatever_readers_ask(
    stored: tuple[Path, bytes],
) -> None:
    """A quarter of the node's store at most: a cache that fills the store would make
    Ray spill the chunks it holds."""
    root, body = stored
    assert chunk_cache.cache_cap(8 * CHUNK) == 2 * CHUNK and chunk_cache.cache_cap(None) is None
    packer = Packer()
    cache = FileChunks(packer, chunk_cache.cache_cap(8 * CHUNK))
    pairs = cache.refs(str(root), "f", len(body), CHUNK, 0, 6, 1 << 30)  # asks for 1 GiB
    assert b"".join(chunk for chunk, _ in pairs) == body  # served whole all the same
    assert cache.counters()["bytes_held"] <= 2 * CHUNK
    uncapped = FileChunks(Packer())
    uncapped.refs(str(root), "f", len(body), CHUNK, 0, 6, 1 << 30)
    assert uncapped.counters()["bytes_held"] == len(body)


def test_a_new_version_of_the_file_is_packed_anew(stored: tuple[Path, bytes]) -> None:
    root, body = stored
    packer = Packer()
    cache = FileChunks(packer)
    cache.refs(str(root), "f", len(body), CHUNK, 0, 6, 1 << 20)
    new = os.urandom(len(body))
    (root / "f.new").write_bytes(new)
    os.replace(root / "f.new", root / "f")  # another inode: another version
    pairs = cache.refs(str(root), "f", len(body), CHUNK, 0, 6, 1 << 20)
    assert b"".join(chunk for chunk, _ in pairs) == new
    assert packer.asked == list(range(6)) * 2


def test_idle_chunks_are_let_go(
    stored: tuple[Path, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, body = stored
    now = [1000.0]
    monkeypatch.setattr(chunk_cache.time, "monotonic", lambda: now[0])
    cache = FileChunks(Packer())
    cache.refs(str(root), "f", len(body), CHUNK, 0, 6, 1 << 20)
    now[0] += chunk_cache.KNOBS.read_cache_idle_s + 1
    cache.refs(str(root), "f", len(body), CHUNK, 0, 1, 1 << 20)  # expires the rest first
    assert cache.counters()["bytes_held"] == CHUNK


def test_a_file_that_changed_size_since_it_was_opened_is_refused(
    stored: tuple[Path, bytes],
) -> None:
    root, body = stored
    with pytest.raises(OSError, match="changed while being read"):
        FileChunks(Packer()).refs(str(root), "f", len(body) + 1, CHUNK, 0, 1, 1 << 20)


def test_paths_are_confined_to_the_root(stored: tuple[Path, bytes]) -> None:
    root, body = stored
    (root / "sub").mkdir()
    with pytest.raises(PermissionError):
        FileChunks(Packer()).refs(str(root / "sub"), "../f", len(body), CHUNK, 0, 1, 1 << 20)


class Starts:
    """Starts a directory transfer as the agent would, recording how many."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, source: Source, config: TransferConfig) -> tuple[Any, Any]:
        self.count += 1
        return f"transfer {self.count} of {source.root}", None


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.bin").write_bytes(os.urandom(5 * CHUNK))
    return tmp_path


def test_readers_in_flight_share_a_transfer_larger_than_the_budget(checkpoint: Path) -> None:
    """Defect: a checkpoint larger than ``cache_bytes`` was packed once per reader,
    even by readers at the same time (the transfer just inserted was evicted at once).
    Readers in flight share one pack whatever its size; once the last is done, only
    what the budget allows is kept."""
    starts, root, config = Starts(), str(checkpoint), TransferConfig(cache_bytes=CHUNK)
    transfers = DirectoryTransfers(starts)
    first, a, _ = transfers.ref(root, "ckpt", config)
    second, b, _ = transfers.ref(root, "ckpt", config)
    transfers.release(a)
    third, c, _ = transfers.ref(root, "ckpt", config)  # b is still reading
    assert first == second == third and starts.count == 1
    assert transfers.bytes_held == 5 * CHUNK and transfers.readers() == 2
    transfers.release(b)
    transfers.release(c)
    transfers.release(c)  # twice: nothing more
    assert transfers.bytes_held == 0 and transfers.readers() == 0
    transfers.ref(root, "ckpt", config)
    assert starts.count == 2 and transfers.bytes_read == 10 * CHUNK


def test_a_transfer_within_the_budget_is_kept_for_later_readers(checkpoint: Path) -> None:
    starts, root, config = Starts(), str(checkpoint), TransferConfig(cache_bytes=8 * CHUNK)
    transfers = DirectoryTransfers(starts)
    _, lease, _ = transfers.ref(root, "ckpt", config)
    transfers.release(lease)
    transfers.ref(root, "ckpt", config)
    assert starts.count == 1 and transfers.bytes_served == 10 * CHUNK


def test_a_transfer_within_the_budget_but_over_the_stores_cap_is_not_kept(
    checkpoint: Path,
) -> None:
    """Readers in flight still share it; once they are done, a node whose store
    holds 8 chunks keeps at most 2 chunks' worth, whatever the readers asked."""
    starts, root, config = Starts(), str(checkpoint), TransferConfig(cache_bytes=8 * CHUNK)
    transfers = DirectoryTransfers(starts, chunk_cache.cache_cap(8 * CHUNK))
    first, a, _ = transfers.ref(root, "ckpt", config)
    second, b, _ = transfers.ref(root, "ckpt", config)
    assert first == second and transfers.bytes_held == 5 * CHUNK
    transfers.release(a)
    transfers.release(b)
    assert transfers.bytes_held == 0
    transfers.ref(root, "ckpt", config)
    assert starts.count == 2


def test_a_reader_that_never_lets_go_is_taken_for_dead(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = [1000.0]
    monkeypatch.setattr(chunk_cache.time, "monotonic", lambda: now[0])
    starts, root, config = Starts(), str(checkpoint), TransferConfig(cache_bytes=CHUNK)
    transfers = DirectoryTransfers(starts)
    transfers.ref(root, "ckpt", config)  # and never released
    now[0] += chunk_cache.KNOBS.read_lease_s - 1
    transfers.ref(root, "ckpt", config)
    assert starts.count == 1 and transfers.readers() == 2
    now[0] += 2  # the first reader's lease is over; the second's holds the transfer
    assert transfers.ref(root, "ckpt", config)[0] == "transfer 1 of " + str(checkpoint / "ckpt")
    assert transfers.readers() == 2
