"""The storage node's cache of file chunks (``storage.disk_chunks``) without Ray: each
chunk of one version of a file is packed once, kept under the readers' byte budget,
dropped when idle, and a new version of the file is packed anew."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from air_transfer.core.layout import Source
from air_transfer.core.packing import ChunkPacker, ChunkPlan
from air_transfer.storage.server import chunk_cache
from air_transfer.storage.server.chunk_cache import FileChunks

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
