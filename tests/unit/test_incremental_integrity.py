"""Incremental node storage keeps every integrity guarantee: a reused chunk is proven
against the bytes on disk when reused (a corrupted or replaced stored file is never
propagated: its chunks are sent again), a source changed after its checksums were
taken fails with SourceChangedError and publishes nothing, a linked file is never
modified in place by a later write, and concurrent stores sharing a base each store
a whole, bit-identical checkpoint."""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

import pytest

from air_transfer.core.checksum import chunk_checksum
from air_transfer.errors import SourceChangedError
from air_transfer.storage.node_api import Commit
from air_transfer.storage.server.incremental import IncrementalStore
from air_transfer.storage.server.report_ledger import GroupStoppedError
from air_transfer.storage.server.senders import local_chunks
from air_transfer.storage.server.uploads import DiskUploads
from tests.support.checkpoints import digest_tree
from tests.support.incremental import (
    CHUNK,
    FILE_BYTES,
    FILES,
    describe,
    make_files,
    rewrite_chunk,
    store,
)


@pytest.fixture
def stored(tmp_path: Path) -> tuple[IncrementalStore, Path, Path]:
    """A store whose root holds ``run/c1``, a copy of ``src``."""
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    src = make_files(tmp_path / "src")
    incremental = IncrementalStore()
    store(incremental, root, root / "run/c1", src)
    return incremental, root, src


def _flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_a_corrupted_stored_chunk_is_sent_again(
    stored: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = stored
    _flip_byte(root / "run/c1/f1", CHUNK + 7)  # bit rot in its second chunk
    stats = store(incremental, root, root / "run/c2", src)
    assert digest_tree(root / "run/c2") == digest_tree(src)
    assert stats["bytes_sent"] == CHUNK  # that chunk alone, the others copied here
    assert stats["bytes_reused"] == FILE_BYTES - CHUNK
    assert stats["chunks_rejected"] >= 2  # as a whole file, then the chunk itself
    assert (root / "run/c2/f1").stat().st_ino != (root / "run/c1/f1").stat().st_ino


def test_a_stored_file_replaced_since_is_not_trusted(
    stored: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = stored
    other = root / "run/c1/.other"
    other.write_bytes(os.urandom(FILE_BYTES))
    os.replace(other, root / "run/c1/f2")  # same size, other bytes, as an overwrite
    stats = store(incremental, root, root / "run/c2", src)
    assert digest_tree(root / "run/c2") == digest_tree(src)
    assert stats["bytes_sent"] == FILE_BYTES


def test_a_source_changed_after_its_checksums_publishes_nothing(
    stored: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = stored
    rewrite_chunk(src / "f3", 1)
    source, files = describe(src)
    rewrite_chunk(src / "f3", 1)  # again, after the sender took its checksums
    with pytest.raises(SourceChangedError, match="f3"):
        incremental.store(
            str(root), str(root / "run/c2"), files, lambda plans: local_chunks(source, plans)
        )
    assert sorted(os.listdir(root / "run")) == ["c1"]


def test_bytes_that_do_not_match_the_announced_checksum_publish_nothing(
    stored: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = stored
    make_files(src, ["f4"])
    source, files = describe(src)
    # The sender announced other bytes for one chunk it must send (a source that
    # changed with the same stamp, or a lying sender): they are refused.
    first_of_f4 = next(first for f, first, _ in files.files() if f.path == "f4")
    sums = list(files.checksums)
    sums[first_of_f4 + 1] = chunk_checksum(b"not these bytes")
    bad = dataclasses.replace(files, checksums=tuple(sums))
    with pytest.raises(SourceChangedError, match="changed since its checksums"):
        incremental.store(
            str(root), str(root / "run/c2"), bad, lambda plans: local_chunks(source, plans)
        )
    assert sorted(os.listdir(root / "run")) == ["c1"]


def test_a_stopped_store_publishes_nothing(stored: tuple[IncrementalStore, Path, Path]) -> None:
    incremental, root, src = stored
    make_files(src, ["f5"])
    source, files = describe(src)
    calls = []

    def check() -> None:
        calls.append(1)
        if len(calls) > FILES + 2:  # once the chunks to send begin
            raise GroupStoppedError("stopped")

    with pytest.raises(GroupStoppedError):
        incremental.store(
            str(root), str(root / "run/c2"), files, lambda p: local_chunks(source, p), check
        )
    assert sorted(os.listdir(root / "run")) == ["c1"]


def test_overwriting_a_linked_file_leaves_the_other_checkpoint_alone(
    stored: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = stored
    stats = store(incremental, root, root / "run/c2", src)
    if not stats["files_linked"]:
        pytest.skip("this filesystem clones files: no inode is shared")
    before = digest_tree(root / "run/c1")
    uploads, new = DiskUploads(), os.urandom(100)
    for append in (False, True):  # every write through node storage replaces the file
        staging, start, expect = uploads.fs_open_write(str(root), str(root / "run/c2/f1"), append)
        commit = Commit(
            str(root / "run/c2/f1"), staging, start, new, chunk_checksum(new), start + len(new),
            expect=expect,
        )  # fmt: skip
        uploads.fs_commit(str(root), commit)
    assert digest_tree(root / "run/c1") == before
    assert (root / "run/c2/f1").stat().st_ino != (root / "run/c1/f1").stat().st_ino


@pytest.mark.parametrize("round_", range(2))
def test_concurrent_stores_sharing_a_base_each_store_a_whole_checkpoint(
    stored: tuple[IncrementalStore, Path, Path], tmp_path: Path, round_: int
) -> None:
    incremental, root, src = stored
    changed = tmp_path / "changed"
    make_files(changed, [])
    for path in src.rglob("*"):
        if path.is_file():
            (changed / path.relative_to(src)).write_bytes(path.read_bytes())
    rewrite_chunk(changed / "f1", 2)
    versions = [src, changed] * 2
    barrier = threading.Barrier(len(versions))
    results: dict[int, dict[str, int] | BaseException] = {}

    def one(i: int) -> None:
        barrier.wait()
        try:
            results[i] = store(incremental, root, root / f"run/n{i}", versions[i])
        except BaseException as e:
            results[i] = e

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(versions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, version in enumerate(versions):
        stats = results[i]
        assert isinstance(stats, dict), stats
        assert digest_tree(root / f"run/n{i}") == digest_tree(version)
        # Whatever order they ran in, only a chunk that no stored checkpoint held
        # travelled: c1 held all of src, and f1's changed chunk at most once per store.
        assert stats["bytes_sent"] in ((0,) if version is src else (0, CHUNK))
    assert digest_tree(root / "run/c1") == digest_tree(src)
