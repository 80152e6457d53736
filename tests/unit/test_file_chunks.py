"""Per-file chunks: boundaries that stay put across checkpoints (a file that grows
shifts no chunk of another), a description that refuses what does not add up, and
the whole-file copies of the storage node (a clone where the filesystem has one,
else a hard link of the descriptor, never of a path)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.file_chunks import ChunkedFiles, chunks_of
from air_transfer.core.reuse import clone_into, link_into, verified
from air_transfer.core.scan import Stamp
from air_transfer.errors import ManifestError
from tests.support.incremental import CHUNK, describe


def test_a_file_growing_shifts_no_chunk_of_another(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(os.urandom(CHUNK + 5))
    (tmp_path / "b").write_bytes(os.urandom(3 * CHUNK))
    before = dict(_by_file(describe(tmp_path)[1]))
    with open(tmp_path / "a", "ab") as f:
        f.write(b"x")  # in the transfer's one stream every chunk of b would move
    after = dict(_by_file(describe(tmp_path)[1]))
    assert after["b"] == before["b"] and after["a"][0] == before["a"][0]
    assert after["a"][1] != before["a"][1] and chunks_of(CHUNK + 6, CHUNK) == 2


def _by_file(files: ChunkedFiles) -> list[tuple[str, tuple[str, ...]]]:
    return [(f.path, sums) for f, _, sums in files.files()]


def test_a_description_that_does_not_add_up_is_refused(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(os.urandom(2 * CHUNK))
    _, files = describe(tmp_path)
    with pytest.raises(ManifestError, match="1 chunk checksums for files that have 2"):
        dataclasses.replace(files, checksums=files.checksums[:1])
    with pytest.raises(ManifestError, match="not a chunk checksum"):
        dataclasses.replace(files, checksums=(files.checksums[0], "../../etc"))
    with pytest.raises(ManifestError, match="0 stamps for 1 files"):
        dataclasses.replace(files, stamps=())
    with pytest.raises(ManifestError, match="says 3 bytes"):
        dataclasses.replace(files, stamps=(Stamp(3, 0),))


def test_a_whole_file_is_cloned_or_linked_by_its_descriptor(tmp_path: Path) -> None:
    body = os.urandom(2 * CHUNK + 1)
    (tmp_path / "base").write_bytes(body)
    sums = (
        chunk_checksum(body[:CHUNK]),
        chunk_checksum(body[CHUNK : 2 * CHUNK]),
        chunk_checksum(body[-1:]),
    )
    buffer = memoryview(bytearray(CHUNK))
    src = os.open(tmp_path / "base", os.O_RDONLY)
    out = os.open(tmp_path / "clone", os.O_RDWR | os.O_CREAT | os.O_EXCL)
    try:
        assert verified(src, len(body), CHUNK, sums, buffer)
        assert not verified(src, len(body), CHUNK, sums[::-1], buffer)
        if clone_into(src, out):  # btrfs, XFS: an inode of its own, the same bytes
            assert verified(out, len(body), CHUNK, sums, buffer)
        else:  # ext4, tmpfs: refused, and the file is left empty
            assert os.fstat(out).st_size == 0
        os.rename(tmp_path / "base", tmp_path / "moved")  # the path changes, the fd holds
        assert link_into(src, str(tmp_path / "linked"))
        assert (tmp_path / "linked").stat().st_ino == os.fstat(src).st_ino
        assert (tmp_path / "linked").read_bytes() == body
        os.unlink(tmp_path / "moved")
        os.unlink(tmp_path / "linked")  # deleted meanwhile: no name to link, refused
        assert not link_into(src, str(tmp_path / "again"))
        assert not (tmp_path / "again").exists()
    finally:
        os.close(src)
        os.close(out)
