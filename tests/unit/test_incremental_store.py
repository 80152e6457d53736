"""Incremental node storage on one machine (``IncrementalStore``, the sender local):
successive checkpoints with 100%, 0%, 50% and 90% of their bytes unchanged, files
renamed or given another mode; each stored bit-identical, only the changed chunks
sent and written, unchanged files stored once, and an older checkpoint deleted
without harm to a later one."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from air_transfer.storage.server.incremental import IncrementalStore
from tests.support.checkpoints import digest_tree
from tests.support.incremental import (
    CHUNK,
    FILE_BYTES,
    FILES,
    TOTAL,
    inodes,
    make_files,
    rewrite_chunk,
    store,
)


@pytest.fixture
def dirs(tmp_path: Path) -> tuple[IncrementalStore, Path, Path]:
    root = tmp_path / "root"
    (root / "run").mkdir(parents=True)
    return IncrementalStore(), root, make_files(tmp_path / "src")


def test_the_first_checkpoint_is_sent_whole(dirs: tuple[IncrementalStore, Path, Path]) -> None:
    incremental, root, src = dirs
    stats = store(incremental, root, root / "run/c1", src)
    assert digest_tree(root / "run/c1") == digest_tree(src)
    assert stats["bytes_sent"] == stats["bytes_written"] == TOTAL
    assert stats["bytes_reused"] == stats["bytes_linked"] == stats["files_linked"] == 0
    assert stats["files"] == FILES + 1


def test_unchanged_files_are_neither_sent_nor_stored_again(
    dirs: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = dirs
    store(incremental, root, root / "run/c1", src)
    stats = store(incremental, root, root / "run/c2", src)  # 100% unchanged
    assert digest_tree(root / "run/c2") == digest_tree(src)
    assert stats["bytes_sent"] == stats["bytes_written"] == stats["bytes_reused"] == 0
    assert stats["files_linked"] + stats["files_cloned"] == FILES
    assert stats["bytes_linked"] + stats["bytes_cloned"] == TOTAL
    # Stored once: 2 checkpoints of the same files take the disk of one.
    assert sum(inodes(root / "run/c1", root / "run/c2").values()) <= TOTAL + 16 * 4096
    assert (root / "run/c2/f1").stat().st_ino == (root / "run/c1/f1").stat().st_ino or (
        stats["files_cloned"] == FILES
    )


def test_changed_bytes_alone_travel(dirs: tuple[IncrementalStore, Path, Path]) -> None:
    incremental, root, src = dirs
    store(incremental, root, root / "run/c1", src)
    expected = {"c1": digest_tree(src)}

    # 0% unchanged: every file rewritten.
    make_files(src)
    stats = store(incremental, root, root / "run/c2", src)
    expected["c2"] = digest_tree(src)
    assert stats["bytes_sent"] == stats["bytes_written"] == TOTAL
    assert stats["bytes_reused"] == stats["bytes_linked"] == 0

    # 50% unchanged: half the files rewritten, half kept.
    make_files(src, [f"f{i}" for i in range(1, 6)])
    stats = store(incremental, root, root / "run/c3", src)
    expected["c3"] = digest_tree(src)
    assert stats["bytes_sent"] == stats["bytes_written"] == 5 * FILE_BYTES
    assert stats["files_linked"] + stats["files_cloned"] == FILES - 5

    # 90% unchanged: one chunk of each of four files changed in place.
    for i in range(1, 5):
        rewrite_chunk(src / f"f{i}", i % 4)
    stats = store(incremental, root, root / "run/c4", src)
    expected["c4"] = digest_tree(src)
    assert stats["bytes_sent"] == 4 * CHUNK  # the 10% that changed
    assert stats["bytes_reused"] == 4 * (FILE_BYTES - CHUNK)  # copied here, not sent
    assert stats["bytes_written"] == 4 * FILE_BYTES
    assert stats["files_linked"] + stats["files_cloned"] == FILES - 4

    # Renamed and moved files, one under another mode: found by content.
    os.rename(src / "f1", src / "renamed")
    os.rename(src / "sub/f0", src / "moved")
    os.chmod(src / "f2", 0o600)
    stats = store(incremental, root, root / "run/c5", src)
    expected["c5"] = digest_tree(src)
    assert stats["bytes_sent"] == 0
    linked = stats["files_linked"] + stats["files_cloned"]
    # Another mode is never linked (one inode has one mode); cloned or copied here.
    assert linked in (FILES - 1, FILES)
    assert stats["bytes_reused"] == (FILES - linked) * FILE_BYTES
    assert (root / "run/c5/f2").stat().st_mode & 0o777 == 0o600
    assert (root / "run/c4/f2").stat().st_mode & 0o777 == 0o644 & ~_umask()

    for name, digest in expected.items():  # every checkpoint still bit-identical
        assert digest_tree(root / "run" / name) == digest, name


def test_deleting_an_older_checkpoint_leaves_later_ones_whole(
    dirs: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = dirs
    store(incremental, root, root / "run/c1", src)
    first = digest_tree(src)
    rewrite_chunk(src / "f1", 0)
    store(incremental, root, root / "run/c2", src)
    second = digest_tree(src)
    shutil.rmtree(root / "run/c1")  # as num_to_keep deletes it
    assert digest_tree(root / "run/c2") == second
    # The index still names c1's files: gone, they are simply not reused.
    stats = store(incremental, root, root / "run/c3", src)
    assert digest_tree(root / "run/c3") == second and stats["bytes_sent"] == 0
    shutil.rmtree(root / "run/c2")
    assert digest_tree(root / "run/c3") == second
    # c1's version of f1's first chunk is gone from storage: it is sent again.
    make_files(src, [])
    os.remove(src / "empty")
    src_first = src.parent / "first"
    shutil.copytree(root / "run/c3", src_first)
    rewrite_chunk(src_first / "f1", 0)
    stats = store(incremental, root, root / "run/c4", src_first)
    assert digest_tree(root / "run/c4") == digest_tree(src_first)
    assert stats["bytes_sent"] == CHUNK
    assert first.keys() == second.keys()


def test_a_checkpoint_merged_into_an_existing_directory(
    dirs: tuple[IncrementalStore, Path, Path],
) -> None:
    incremental, root, src = dirs
    store(incremental, root, root / "run/c1", src)
    (root / "run/c2").mkdir()
    (root / "run/c2/extra").write_bytes(b"kept")
    store(incremental, root, root / "run/c2", src)
    merged = digest_tree(root / "run/c2")
    assert merged.pop("extra") and merged == digest_tree(src)
    assert (root / "run/c2/extra").read_bytes() == b"kept"


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
