"""Writers killed mid-publish, racing each other, or alive in another container: the
target is always absent or one complete tree (no Ray; real processes, SIGKILL)."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from air_transfer.core.writer import write_tree
from air_transfer.storage.server.metadata import DiskStorage
from tests.support.trees import build_manifest, file_contents, leftovers
from tests.support.waiting import eventually
from tests.support.writer_child import merged_files, new_files, old_files
from tests.support.writer_procs import TIMEOUT, Child, assert_one_tree, put_files, tree_of


def test_a_merge_killed_mid_publish_leaves_the_old_or_the_new_tree(tmp_path: Path) -> None:
    """5,000 files, the writer SIGKILLed the moment the target changes. It used to
    hold all but 5 of the old files and 5 new ones; now the whole new tree is in
    place when anything is, and the next writer removes what the dead one left."""
    n = 5_000
    target = tmp_path / "out"
    put_files(target, old_files(n))
    watched = target / min(new_files(n).keys() & old_files(n).keys())  # replaced first
    inode = os.stat(watched).st_ino
    child = Child("merge", str(target), str(n))
    child.wait_for("writing")
    # Polled without a pause (the kill must come the moment the target changes),
    # yielding the CPU to the child, which needs it more.
    eventually(
        lambda: child.proc.poll() is not None or os.stat(watched).st_ino != inode,
        "the merge to change the target",
        TIMEOUT,
        interval_s=0,
    )
    child.kill()
    old, new = tree_of(old_files(n)), tree_of(merged_files(n))
    assert assert_one_tree(file_contents(target), old, new) == "new"
    write_tree(*build_manifest({"extra": b"x"}), target)
    assert file_contents(target) == new | {"extra": b"x"}
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize(
    ("pause", "exchange", "seen"),
    [
        ("before-swap", True, "old"),
        ("after-swap", True, "new"),
        ("before-swap", False, "old"),
        ("between-renames", False, "absent"),
        ("after-swap", False, "new"),
    ],
)
def test_a_writer_killed_at_each_step_of_the_swap(
    tmp_path: Path, pause: str, exchange: bool, seen: str
) -> None:
    """What a reader sees after the kill, at each step, with RENAME_EXCHANGE and
    without it (then the target is missing between two renames, and the next writer
    finishes the swap: the staging was complete)."""
    n = 200
    target = tmp_path / "out"
    put_files(target, old_files(n))
    flags = ["--pause", pause] + ([] if exchange else ["--no-exchange"])
    child = Child("merge", str(target), str(n), *flags)
    child.wait_for("ready")
    child.kill()
    old, new = tree_of(old_files(n)), tree_of(merged_files(n))
    if seen == "absent":
        assert not target.exists()
    else:
        assert assert_one_tree(file_contents(target), old, new) == seen
    write_tree(*build_manifest({"extra": b"x"}), target)
    assert file_contents(target) == (old if seen == "old" else new) | {"extra": b"x"}
    assert leftovers(tmp_path) == []


def test_staging_locked_by_a_writer_in_another_pid_namespace_is_kept(tmp_path: Path) -> None:
    """A live writer whose pid is not visible here (a container,
    another host on NFS) holds its staging's lock: another writer must not remove its
    staging; once the lock is free, the next writer does."""
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    live = tmp_path / f".out.air-staging-{pid_max + 1}-{'a' * 16}"
    (live / "half").mkdir(parents=True)
    lock = Path(f"{live}.lock")
    lock.touch()
    holder = Child("hold", str(lock))
    try:
        holder.wait_for("ready")
        write_tree(*build_manifest({"f": b"1"}), tmp_path / "out")
        assert (live / "half").is_dir() and lock.exists()
    finally:
        holder.finish()
    write_tree(*build_manifest({"g": b"2"}), tmp_path / "out")
    assert file_contents(tmp_path / "out") == {"f": b"1", "g": b"2"}
    assert leftovers(tmp_path) == []


def staging_of(parent: Path, target: str) -> list[str]:
    """The staging directory and lock file of writers of ``target`` in ``parent``."""
    return sorted(n for n in os.listdir(parent) if n.startswith(f".{target}.air-staging-"))


def test_a_dead_writers_staging_is_never_listed_and_is_reclaimed(tmp_path: Path) -> None:
    """Defect: a writer SIGKILLed mid-write (the storage agent, mid-report) left its
    staging and lock file in the run's directory for good, and node storage listed
    them: only the next writer of the same target removed them, and Ray Train never
    writes a checkpoint's name twice. Listings leave every name the library makes out
    and remove a dead writer's staging; a live writer's staging is left to it, and the
    next writer of any target in the directory reclaims it once its writer is dead."""
    n = 200
    exp = tmp_path / "exp"
    for name in ("checkpoint_1", "checkpoint_2"):
        put_files(exp / name, old_files(n))
    dead = Child("merge", str(exp / "checkpoint_1"), str(n), "--pause", "before-swap")
    live = Child("merge", str(exp / "checkpoint_2"), str(n), "--pause", "before-swap")
    try:
        dead.wait_for("ready")
        live.wait_for("ready")
        assert len(staging_of(exp, "checkpoint_1")) == len(staging_of(exp, "checkpoint_2")) == 2
        dead.kill()
        listed = DiskStorage().fs_list(str(tmp_path), str(exp), False, False)
        assert sorted(path for path, *_ in listed) == ["checkpoint_1", "checkpoint_2"]
        assert staging_of(exp, "checkpoint_1") == []  # reclaimed by the listing
        kept = staging_of(exp, "checkpoint_2")
        assert len(kept) == 2  # a live writer's: left to it
        infos = DiskStorage().fs_info(str(tmp_path), [str(exp / p) for p in kept])
        assert [t for t, _, _ in infos] == [pafs.FileType.NotFound] * 2
        recursive = DiskStorage().fs_list(str(tmp_path), str(exp), True, False)
        assert not [path for path, *_ in recursive if ".air-" in path]
        write_tree(*build_manifest({"f": b"1"}), exp / "checkpoint_3")
        assert staging_of(exp, "checkpoint_2") == kept
    finally:
        live.kill()
    write_tree(*build_manifest({"f": b"1"}), exp / "checkpoint_4")  # another target
    assert leftovers(exp) == []
    assert file_contents(exp / "checkpoint_2") == tree_of(old_files(n))
