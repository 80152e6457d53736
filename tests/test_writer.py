"""chunks -> files: exact reproduction, atomic publish, merge, and refusals (no Ray)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from trees import assert_same_tree, rich_tree, tree_listing

from air_transfer import ChecksumError, Manifest
from air_transfer.config import MIN_CHUNK_BYTES
from air_transfer.layout import Source, scan
from air_transfer.manifest import chunk_checksum
from air_transfer.packing import read_chunks
from air_transfer.writer import write_tree


def local_pack(root: Path, chunk_bytes: int = MIN_CHUNK_BYTES) -> tuple[Manifest, list[bytes]]:
    source = Source(pafs.LocalFileSystem(), str(root))
    scanned = scan(source)
    chunks = [
        bytes(v)
        for _, v in read_chunks(
            source,
            scanned.files,
            scanned.stamps,
            chunk_bytes,
            lambda i, n: memoryview(bytearray(n)),
        )
    ]
    return Manifest(scanned.entries, chunk_bytes, tuple(map(chunk_checksum, chunks))), chunks


def no_staging_left(parent: Path) -> bool:
    return not [p for p in os.listdir(parent) if ".air-staging-" in p]


def test_reproduces_a_rich_tree(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    out = write_tree(manifest, chunks, tmp_path / "out")
    assert out == str(tmp_path / "out")
    assert_same_tree(src, tmp_path / "out")
    assert no_staging_left(tmp_path)


def test_creates_missing_parents_and_fills_an_empty_target(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    write_tree(manifest, chunks, tmp_path / "a" / "b" / "out")
    assert_same_tree(src, tmp_path / "a" / "b" / "out")
    (tmp_path / "empty_target").mkdir()
    write_tree(manifest, chunks, tmp_path / "empty_target")
    assert_same_tree(src, tmp_path / "empty_target")


def test_merges_into_an_existing_directory(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    target = tmp_path / "out"
    (target / "sub").mkdir(parents=True)
    (target / "keep.txt").write_bytes(b"mine")
    (target / "model.bin").write_bytes(b"old version")
    write_tree(manifest, chunks, target)
    listing = tree_listing(target)
    assert listing.pop("keep.txt")[2] == b"mine"
    assert listing == tree_listing(src)
    assert no_staging_left(tmp_path)


def test_a_corrupt_chunk_names_chunk_and_files_and_publishes_nothing(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src, chunk_bytes=20_000)
    bad = bytearray(chunks[1])
    bad[5] ^= 0xFF
    chunks[1] = bytes(bad)
    with pytest.raises(ChecksumError, match=r"chunk 1 of \d+ .*'model.bin'"):
        write_tree(manifest, chunks, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert no_staging_left(tmp_path)


def test_a_corrupt_chunk_leaves_an_existing_target_untouched(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    target = tmp_path / "out"
    target.mkdir()
    (target / "model.bin").write_bytes(b"previous")
    before = tree_listing(target)
    chunks[-1] = chunks[-1][:-1] + bytes([chunks[-1][-1] ^ 1])
    with pytest.raises(ChecksumError):
        write_tree(manifest, chunks, target)
    assert tree_listing(target) == before
    assert no_staging_left(tmp_path)


def test_verify_false_skips_checksums_but_not_lengths(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"abcd" * 256 + b"efgh" * 256)  # two chunks of MIN_CHUNK_BYTES
    manifest, _ = local_pack(src)
    write_tree(manifest, [b"ABCD" * 256, b"EFGH" * 256], tmp_path / "unchecked", verify=False)
    assert (tmp_path / "unchecked" / "f").read_bytes() == b"ABCD" * 256 + b"EFGH" * 256
    with pytest.raises(ChecksumError, match="1023 bytes, expected 1024"):
        write_tree(manifest, [b"abcd" * 256, b"e" * 1023], tmp_path / "short", verify=False)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([b"abcd" * 256], "ended after 1 of 2 chunks"),
        ([b"abcd" * 256, b"efgh" * 256, b"ijkl" * 256], "more chunks than the 2"),
    ],
)
def test_wrong_chunk_count_is_refused(tmp_path: Path, chunks: list, message: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"abcd" * 256 + b"efgh" * 256)
    manifest, _ = local_pack(src)
    with pytest.raises(ChecksumError, match=message):
        write_tree(manifest, chunks, tmp_path / "out")
    assert not (tmp_path / "out").exists() and no_staging_left(tmp_path)


def test_target_that_is_a_file_is_refused(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    (tmp_path / "out").write_bytes(b"a file")
    with pytest.raises(NotADirectoryError, match="out"):
        write_tree(manifest, chunks, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"a file"


@pytest.mark.parametrize("clash", ["file_where_dir", "dir_where_file", "symlink_where_dir"])
def test_merge_that_changes_a_kind_is_refused_before_writing(tmp_path: Path, clash: str) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    target = tmp_path / "out"
    target.mkdir()
    if clash == "file_where_dir":
        (target / "sub").write_bytes(b"not a dir")
    elif clash == "dir_where_file":
        (target / "model.bin").mkdir()
    else:
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", target / "sub")  # writes would follow it
    before = tree_listing(target)
    with pytest.raises(FileExistsError, match="cannot merge checkpoint into"):
        write_tree(manifest, chunks, target)
    assert tree_listing(target) == before
    if clash == "symlink_where_dir":
        assert os.listdir(tmp_path / "elsewhere") == []
    assert no_staging_left(tmp_path)


def test_stale_staging_of_a_dead_writer_is_removed(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    # A pid that is certainly not running: beyond the kernel's pid_max.
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    stale = tmp_path / f".out.air-staging-{pid_max + 1}-deadbeef"
    (stale / "half").mkdir(parents=True)
    live = tmp_path / f".out.air-staging-{os.getpid()}-cafecafe"
    live.mkdir()
    write_tree(manifest, chunks, tmp_path / "out")
    assert not stale.exists()
    assert live.exists()  # a writer that is still running keeps its staging
