"""Publishing a checkpoint when something else is in the way: a mount inside the
target, a filesystem without RENAME_EXCHANGE, a writer that died mid-swap or left
its staging, trees deeper than the recursion limit (no Ray)."""

from __future__ import annotations

import errno
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from air_transfer import ChecksumError
from air_transfer.config import MIN_CHUNK_BYTES
from air_transfer.core import staging
from air_transfer.core.tree_removal import rmtree
from air_transfer.core.writer import write_tree
from tests.support.packs import local_pack
from tests.support.trees import Link, build_manifest, file_contents, leftovers, rich_tree


def test_a_mount_inside_the_target_is_refused_and_never_removed(tmp_path: Path) -> None:
    """The merged tree cannot carry a mount, and the tree it replaces is deleted: a
    mount inside the target is refused (EXDEV) before anything is written."""
    target = tmp_path / "out"
    (target / "mnt").mkdir(parents=True)
    mount = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(target / "mnt")]
    if subprocess.run(mount, capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (not root?)")
    try:
        (target / "mnt" / "precious").write_bytes(b"p")
        with pytest.raises(OSError, match="mount point inside the target") as raised:
            write_tree(*build_manifest({"f": b"1"}), target)
        assert (raised.value.errno, raised.value.filename) == (errno.EXDEV, str(target / "mnt"))
        with pytest.raises(OSError, match="mount point inside a tree being removed"):
            rmtree(str(target))
        assert (target / "mnt" / "precious").read_bytes() == b"p"
    finally:
        subprocess.run(["umount", str(target / "mnt")], check=True)
    assert leftovers(tmp_path) == []


def test_merge_without_rename_exchange_swaps_with_two_renames(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the filesystem refuses RENAME_EXCHANGE (NFS), the same merged tree."""

    def refused(a: str, b: str) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL), a)

    monkeypatch.setattr(staging, "exchange", refused)
    target = tmp_path / "out"
    write_tree(*build_manifest({"a": b"1", "d/b": b"2"}), target)
    write_tree(*build_manifest({"a": b"3", "c": b"4"}), target)
    assert file_contents(target) == {"a": b"3", "c": b"4", "d": "", "d/b": b"2"}
    assert leftovers(tmp_path) == []


def crashed_swap(tmp_path: Path, staged: bool) -> tuple[Path, Path, Path]:
    """The state a writer leaves when it dies between the two renames of a swap
    without RENAME_EXCHANGE: the target gone, the old tree aside, and the complete
    staging (marked in its lock file) unless ``staged`` is False."""
    suffix = f"999999999-{uuid.uuid4().hex[:16]}"
    target = tmp_path / "out"
    old = tmp_path / f".out.air-old-{suffix}"
    new = tmp_path / f".out.air-staging-{suffix}"
    old.mkdir()
    (old / "f").write_bytes(b"old")
    (tmp_path / f".out.air-staging-{suffix}.lock").write_bytes(staging.SWAP_MARK)
    if staged:
        new.mkdir()
        (new / "f").write_bytes(b"new")
    return target, old, new


@pytest.mark.parametrize("staged", [True, False], ids=["roll-forward", "roll-back"])
def test_the_next_writer_finishes_or_rolls_back_a_dead_writers_swap(
    tmp_path: Path, staged: bool
) -> None:
    target, _, _ = crashed_swap(tmp_path, staged)
    write_tree(*build_manifest({"g": b"g"}), target)
    assert file_contents(target) == {"f": b"new" if staged else b"old", "g": b"g"}
    assert leftovers(tmp_path) == []


def test_the_next_writer_removes_the_tree_a_dead_writers_swap_replaced(tmp_path: Path) -> None:
    target, _, new = crashed_swap(tmp_path, staged=True)
    new.rename(target)  # it died after the second rename
    write_tree(*build_manifest({"g": b"g"}), target)
    assert file_contents(target) == {"f": b"new", "g": b"g"}
    assert leftovers(tmp_path) == []


# -- a writer's liveness is a lock, never a pid -----------------------------------------
def test_staging_whose_lock_is_free_is_removed_whatever_pid_it_names(tmp_path: Path) -> None:
    """A writer in this pid namespace (its pid runs: ours) that holds no lock is dead:
    pids say nothing across containers and hosts. (The other half, a live lock with
    a pid not visible here, is in test_writer_crash.py.)"""
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    unlocked = tmp_path / f".out.air-staging-{os.getpid()}-{'c' * 16}"
    (unlocked / "half").mkdir(parents=True)
    Path(f"{unlocked}.lock").touch()
    lockless = tmp_path / f".out.air-staging-{os.getppid()}-{'d' * 16}"
    lockless.mkdir()
    orphan_lock = tmp_path / f".out.air-staging-{os.getpid()}-{'e' * 16}.lock"
    orphan_lock.touch()
    write_tree(manifest, chunks, tmp_path / "out")
    assert leftovers(tmp_path) == []


def test_no_lock_files_are_left_behind(tmp_path: Path) -> None:
    """The lock directory used to grow by one file per target written."""
    lock_dir = Path(tempfile.gettempdir()) / "air-transfer-locks"
    before = set(os.listdir(lock_dir)) if lock_dir.is_dir() else set()
    write_tree(*build_manifest({"a": b"1"}), tmp_path / "out")
    write_tree(*build_manifest({"b": b"2"}), tmp_path / "out")  # a merge
    assert sorted(os.listdir(tmp_path)) == ["out"]
    after = set(os.listdir(lock_dir)) if lock_dir.is_dir() else set()
    assert after <= before


# -- no recursion limit -------------------------------------------------------------------
DEPTH = 1200


def deep_spec(leaf: bytes, name: str = "d") -> dict[str, bytes | Link | None]:
    return {"/".join([name] * DEPTH) + "/leaf": leaf, "top": b"t" * 10}


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """tmp_path, emptied afterwards without recursion: pytest removes old temporary
    directories with shutil.rmtree, which a 1,200-level tree would stop."""
    yield tmp_path
    for name in os.listdir(tmp_path):
        rmtree(str(tmp_path / name))


def test_a_deep_tree_with_a_corrupt_chunk_raises_checksum_error(deep_tmp: Path) -> None:
    """A 1,200-level tree: ChecksumError (not RecursionError from the cleanup), no
    staging left, and the next write to that target works."""
    manifest, chunks = build_manifest(deep_spec(b"x" * 2100), chunk_bytes=MIN_CHUNK_BYTES)
    bad = [chunks[0], bytes(len(chunks[1])), *chunks[2:]]
    with pytest.raises(ChecksumError, match="chunk 1 of 3"):
        write_tree(manifest, bad, deep_tmp / "out")
    assert not (deep_tmp / "out").exists()
    assert leftovers(deep_tmp) == []
    write_tree(manifest, chunks, deep_tmp / "out")
    assert file_contents(deep_tmp / "out")["/".join(["d"] * DEPTH) + "/leaf"] == b"x" * 2100


def test_a_deep_tree_merges_into_a_deep_target(deep_tmp: Path) -> None:
    """The merge walk, the link check and the removal of the replaced tree, 1,200
    levels down."""
    target = deep_tmp / "out"
    write_tree(*build_manifest(deep_spec(b"first")), target)
    deep = "/".join(["d"] * DEPTH)
    write_tree(*build_manifest({f"{deep}/leaf": b"again", f"{deep}/up": Link("../..")}), target)
    contents = file_contents(target)
    assert (contents[f"{deep}/leaf"], contents[f"{deep}/up"]) == (b"again", "-> ../..")
    assert contents["top"] == b"t" * 10
    assert leftovers(deep_tmp) == []
