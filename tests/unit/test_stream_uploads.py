"""Incremental upload streams on the storage node (``StreamUploads``), no Ray: a
chunk is copied from a stored file only once read and proven (a corrupted one is
fetched instead), only the rest is fetched, files committed one by one serve later
streams and directory stores alike and count as one checkpoint of their directory,
and a commit with bad checksums stores nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from air_transfer.core.aligned_writes import ALIGN
from air_transfer.core.checksum import chunk_checksum
from air_transfer.errors import ManifestError
from air_transfer.storage.node_api import ChunkAt, IndexedCommit
from air_transfer.storage.server import stored_chunks, uploads
from air_transfer.storage.server.chunk_index import GROUP_CHUNKS, KEEP, ChunkIndex
from air_transfer.storage.server.incremental import IncrementalStore
from air_transfer.storage.server.senders import local_chunks
from air_transfer.storage.server.stream_uploads import StreamUploads
from air_transfer.storage.server.uploads import DiskUploads
from tests.support.direct import o_direct_refused
from tests.support.incremental import describe

CHUNK = 4096


class Streams:
    """Streams into ``root`` as a ``NodeUpload`` offering its chunks (``Route.OFFER``)
    drives them, with the chunks "sent" by value; ``fetched`` counts the chunks that
    had to come."""

    def __init__(self, root: Path) -> None:
        self.root, self.uploads, self.store = str(root), DiskUploads(), IncrementalStore()
        self.fetched = 0

        def fetch(ref: Any) -> Any:
            self.fetched += 1
            return ref

        self.streams = StreamUploads(self.uploads, self.store, fetch)

    def write(self, path: str, body: bytes) -> list[bool]:
        """Upload ``body`` to ``path``; whether each full chunk was reused."""
        local = f"{self.root}/{path}"
        staging, _, _ = self.uploads.fs_open_write(self.root, local, False)
        full = len(body) // CHUNK * CHUNK
        pieces = [body[o : o + CHUNK] for o in range(0, full, CHUNK)]
        sums = [chunk_checksum(p) for p in pieces]
        answers = [
            self.streams.fs_write_or_reuse(self.root, ChunkAt(staging, k * CHUNK), s, len(p), [p])
            for k, (p, s) in enumerate(zip(pieces, sums, strict=True))
        ]
        tail = body[full:]
        if tail:
            sums.append(chunk_checksum(tail))
        commit = IndexedCommit(
            local, staging, full, tail, chunk_checksum(tail), len(body),
            sums=tuple(sums), chunk_bytes=CHUNK,
        )  # fmt: skip
        self.streams.fs_commit_indexed(self.root, commit)
        return answers


def test_a_stream_copies_only_proven_chunks_and_fetches_the_rest(tmp_path: Path) -> None:
    (tmp_path / "c1").mkdir()
    (tmp_path / "c2").mkdir()
    (tmp_path / "c3").mkdir()
    s = Streams(tmp_path)
    body = os.urandom(4 * CHUNK + 100)
    assert s.write("c1/shard", body) == [False] * 4 and s.fetched == 4

    changed = body[:CHUNK] + os.urandom(CHUNK) + body[2 * CHUNK :]
    s.fetched = 0
    assert s.write("c2/shard", changed) == [True, False, True, True] and s.fetched == 1
    assert (tmp_path / "c2/shard").read_bytes() == changed

    for stored in ("c1/shard", "c2/shard"):  # chunk 2 corrupted wherever it is stored
        with open(tmp_path / stored, "r+b") as f:
            f.seek(2 * CHUNK + 7)
            f.write(b"\0" * 8)
    before = s.store.totals()
    assert s.write("c3/shard", changed) == [True, True, False, True]
    assert (tmp_path / "c3/shard").read_bytes() == changed
    cost = {k: v - before[k] for k, v in s.store.totals().items()}
    # Rejected: chunk 2 in each stored file, then c2/shard as a whole (not linked).
    assert cost["chunks_rejected"] == 3 and cost["bytes_sent"] == CHUNK + 100
    assert cost["files_linked"] == 0
    assert cost["bytes_reused"] == 3 * CHUNK and cost["files"] == 1


def test_a_reused_chunk_is_hashed_once_and_read_onto_a_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stored copy is hashed by its proof and written without a second hash (a
    fetched chunk is hashed on arrival), from a buffer that starts on a page, so
    that a direct write takes it as it is."""
    (tmp_path / "c1").mkdir()
    (tmp_path / "c2").mkdir()
    s, body = Streams(tmp_path), os.urandom(3 * CHUNK)
    s.write("c1/shard", body)
    view = s.store.reuse_chunk(str(tmp_path), chunk_checksum(body[CHUNK : 2 * CHUNK]), CHUNK)
    assert view is not None and bytes(view) == body[CHUNK : 2 * CHUNK]
    assert np.frombuffer(view, np.uint8).ctypes.data % ALIGN == 0
    hashed: list[int] = []
    real = uploads.chunk_checksum
    monkeypatch.setattr(uploads, "chunk_checksum", lambda v: hashed.append(len(v)) or real(v))
    changed = body[:CHUNK] + os.urandom(CHUNK) + body[2 * CHUNK :]
    assert s.write("c2/shard", changed) == [True, False, True]
    assert CHUNK in hashed and hashed.count(CHUNK) == 1  # the fetched chunk alone
    assert (tmp_path / "c2/shard").read_bytes() == changed


@pytest.mark.parametrize("direct", [True, False], ids=["disk-reads-it", "through-the-cache"])
def test_a_reused_chunk_is_read_around_the_page_cache_where_it_can_be(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, direct: bool
) -> None:
    """The disk reads a stored chunk straight into its page-aligned buffer (the
    kernel's copy out of the page cache was most of a storage node's CPU), a file's
    last chunk of any length too; where O_DIRECT cannot be had, it is read through
    the cache. Either way only proven bytes are reused."""
    if direct and o_direct_refused(tmp_path):
        pytest.skip("this filesystem takes no O_DIRECT")
    (tmp_path / "c1").mkdir()
    s, body = Streams(tmp_path), os.urandom(2 * CHUNK + 3000)
    s.write("c1/shard", body)
    reads: list[int | None] = []
    real = stored_chunks.pread_direct

    def spy(fd: int, offset: int, buffer: memoryview) -> int | None:
        reads.append(real(fd, offset, buffer) if direct else None)
        return reads[-1]

    monkeypatch.setattr(stored_chunks, "pread_direct", spy)
    for at, length in ((CHUNK, CHUNK), (2 * CHUNK, 3000)):
        piece = body[at : at + length]
        view = s.store.reuse_chunk(str(tmp_path), chunk_checksum(piece), length)
        assert view is not None and bytes(view) == piece
    assert reads == ([CHUNK, 3000] if direct else [None, None])
    with open(tmp_path / "c1/shard", "r+b") as f:  # a stored copy altered: not reused
        f.seek(CHUNK + 5)
        f.write(b"\0" * 3)
    altered = chunk_checksum(body[CHUNK : 2 * CHUNK])
    assert s.store.reuse_chunk(str(tmp_path), altered, CHUNK) is None


def test_a_streamed_file_is_linked_or_cloned_by_a_directory_store(tmp_path: Path) -> None:
    """Streams and directory stores share one index: a directory store finds the
    streamed shard whole and stores it without a byte sent."""
    (tmp_path / "c1").mkdir()
    s, body = Streams(tmp_path), os.urandom(3 * CHUNK + 5)
    s.write("c1/shard", body)
    src = tmp_path / "src"
    src.mkdir()
    (src / "shard").write_bytes(body)
    os.chmod(src / "shard", (tmp_path / "c1/shard").stat().st_mode)  # a link needs it
    source, files = describe(src, CHUNK)
    cost = s.store.store(
        str(tmp_path), str(tmp_path / "c2"), files, lambda p: local_chunks(source, p)
    )
    assert cost["bytes_sent"] == 0 and cost["bytes_linked"] + cost["bytes_cloned"] == len(body)
    assert (tmp_path / "c2/shard").read_bytes() == body


def test_a_commit_with_wrong_checksums_stores_nothing(tmp_path: Path) -> None:
    s = Streams(tmp_path)
    local = f"{tmp_path}/f"
    staging, _, _ = s.uploads.fs_open_write(str(tmp_path), local, False)
    with pytest.raises(ManifestError, match="1 chunk checksums for a file of 8292 bytes"):
        s.streams.fs_commit_indexed(
            str(tmp_path),
            IndexedCommit(
                local, staging, 0, b"x" * 8292, chunk_checksum(b"x"), 8292,
                sums=(chunk_checksum(b"x"),), chunk_bytes=CHUNK,
            ),
        )  # fmt: skip
    assert os.listdir(tmp_path) == []
    staging, _, _ = s.uploads.fs_open_write(str(tmp_path), local, False)
    with pytest.raises(ValueError, match="a chunk length of 1"):
        s.streams.fs_write_or_reuse(
            str(tmp_path), ChunkAt(staging, 0), chunk_checksum(b""), 0, [b""]
        )


def test_files_committed_into_one_directory_are_one_checkpoint_of_the_index() -> None:
    """A save of more files than ``KEEP`` does not push the last save out."""
    index, sums = ChunkIndex(), (chunk_checksum(b"a"),)
    index.add("/r", [("/r/c1/f", 1, sums)], CHUNK, group="/r/c1")
    for i in range(KEEP + 2):
        index.add("/r", [(f"/r/c2/f{i}", 1, (chunk_checksum(str(i).encode()),))], CHUNK, "/r/c2")
    assert list(index.files("/r", 1, sums)) == ["/r/c1/f"]
    for i in range(KEEP):
        index.add("/r", [(f"/r/d{i}/f", 1, (chunk_checksum(b"b"),))], CHUNK, f"/r/d{i}")
    assert list(index.files("/r", 1, sums)) == []  # KEEP newer checkpoints since


def test_a_group_that_goes_on_stays_bounded_and_newest() -> None:
    """A writer-placed storage's blobs, one group per holder that only grows: its
    oldest files stop being offered beyond ``GROUP_CHUNKS``, a path stored again
    offers only its new bytes, and a group written to again is the newest."""
    index, half = ChunkIndex(), GROUP_CHUNKS // 2 + 1
    old, new = (tuple(f"{k:032x}" for k in range(i * half, (i + 1) * half)) for i in (0, 1))
    index.add("/r", [("/r/g/old", half * CHUNK, old)], CHUNK, "/r/g")
    index.add("/r", [("/r/g/new", half * CHUNK, new)], CHUNK, "/r/g")
    assert list(index.chunks("/r", old[0], CHUNK)) == []
    assert list(index.files("/r", half * CHUNK, old)) == []
    assert list(index.chunks("/r", new[-1], CHUNK)) == [("/r/g/new", (half - 1) * CHUNK)]
    index.add("/r", [("/r/g/new", CHUNK, ("f" * 32,))], CHUNK, "/r/g")  # stored again
    assert list(index.chunks("/r", new[0], CHUNK)) == []
    for i in range(KEEP - 1):
        index.add("/r", [(f"/r/d{i}/f", 1, (f"{i:032x}",))], CHUNK, f"/r/d{i}")
    index.add("/r", [("/r/g/last", CHUNK, ("e" * 32,))], CHUNK, "/r/g")
    index.add("/r", [("/r/d9/f", 1, ("d" * 32,))], CHUNK, "/r/d9")  # pushes d0 out, not g
    assert list(index.chunks("/r", "f" * 32, CHUNK)) == [("/r/g/new", 0)]
    assert list(index.chunks("/r", f"{0:032x}", 1)) == []


def test_a_stream_of_bytes_a_stored_file_holds_becomes_a_link_of_it(tmp_path: Path) -> None:
    """A shard unchanged since an earlier save is one copy on disk: a hard link of the
    stored file, once its bytes are proven; deleting the older leaves the newer."""
    for d in ("c1", "c2", "c3"):
        (tmp_path / d).mkdir()
    s, body = Streams(tmp_path), os.urandom(3 * CHUNK + 100)
    s.write("c1/shard", body)
    before = s.store.totals()
    assert s.write("c2/shard", body) == [True] * 3
    cost = {k: v - before[k] for k, v in s.store.totals().items()}
    assert cost["files_linked"] == 1 and cost["bytes_linked"] == len(body)
    first, second = (tmp_path / "c1/shard").stat(), (tmp_path / "c2/shard").stat()
    assert first.st_ino == second.st_ino and second.st_nlink == 2
    (tmp_path / "c1/shard").unlink()
    assert (tmp_path / "c2/shard").read_bytes() == body
    assert s.write("c3/shard", body) == [True] * 3  # the link serves later saves
    assert (tmp_path / "c3/shard").stat().st_ino == second.st_ino
    assert not [p for d in ("c1", "c2", "c3") for p in os.listdir(tmp_path / d) if p != "shard"]


@pytest.mark.parametrize("spoil", ["corrupted", "other mode"])
def test_a_stored_file_not_proven_or_of_another_mode_is_not_linked(
    tmp_path: Path, spoil: str
) -> None:
    """Its good chunks are still copied, but the new file is a copy of its own."""
    (tmp_path / "c1").mkdir()
    (tmp_path / "c2").mkdir()
    s, body = Streams(tmp_path), os.urandom(3 * CHUNK + 100)
    s.write("c1/shard", body)
    stored = tmp_path / "c1/shard"
    if spoil == "corrupted":  # in its tail, which no chunk of the stream asks about
        with open(stored, "r+b") as f:
            f.seek(3 * CHUNK + 50)
            f.write(b"\0" * 8)
    else:
        os.chmod(stored, 0o600)
    before = s.store.totals()
    assert s.write("c2/shard", body) == [True] * 3
    cost = {k: v - before[k] for k, v in s.store.totals().items()}
    assert cost["files_linked"] == 0 and cost["chunks_rejected"] == int(spoil == "corrupted")
    assert (tmp_path / "c2/shard").read_bytes() == body
    assert (tmp_path / "c2/shard").stat().st_ino != stored.stat().st_ino
