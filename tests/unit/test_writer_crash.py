"""Writers killed mid-publish, racing each other, or alive in another container: the
target is always absent or one complete tree (no Ray; real processes, SIGKILL)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from air_transfer.core import merge
from air_transfer.core.dirtree import DirCursor, Visit
from air_transfer.core.writer import write_tree
from air_transfer.storage.server.metadata import DiskStorage
from tests.support.procs import REPO_ROOT, child_env
from tests.support.trees import build_manifest, file_contents, leftovers
from tests.support.waiting import eventually
from tests.support.writer_child import merged_files, new_files, old_files, race_files

TIMEOUT = 120.0


class Child:
    """A ``tests.support.writer_child`` process and the lines it prints."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.writer_child", *args],
            cwd=REPO_ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")  # it exited

    def wait_for(self, expected: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"the child printed no {expected!r} in {TIMEOUT}s") from None
            if line == expected:
                return
            if line == "":
                assert self.proc.stderr is not None
                raise AssertionError(
                    f"the child exited ({self.proc.wait()}) before {expected!r}:\n"
                    f"{self.proc.stderr.read()}"
                )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def finish(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=TIMEOUT) == 0, self.proc.stderr and self.proc.stderr.read()


def put_files(root: Path, files: dict[str, bytes]) -> None:
    for directory in {os.path.dirname(p) for p in files}:
        os.makedirs(root / directory, exist_ok=True)
    for path, data in files.items():
        fd = os.open(f"{root}/{path}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.close(fd)


def tree_of(files: dict[str, bytes]) -> dict[str, bytes | str]:
    """What ``file_contents`` reads back from a tree holding ``files``."""
    tree: dict[str, bytes | str] = {}
    for path, data in files.items():
        parts = path.split("/")
        for i in range(1, len(parts)):
            tree["/".join(parts[:i])] = ""
        tree[path] = data
    return tree


def assert_one_tree(got: dict[str, bytes | str], old: dict, new: dict) -> str:
    """``got`` is exactly ``old`` or exactly ``new``; returns which."""
    if got == old:
        return "old"
    if got == new:
        return "new"
    from_old = sum(1 for p, v in got.items() if old.get(p) == v and new.get(p) != v)
    from_new = sum(1 for p, v in got.items() if new.get(p) == v and old.get(p) != v)
    raise AssertionError(
        f"the target is neither tree: {from_old} entries only the old one has, "
        f"{from_new} only the new one, {len(got)} in all (old {len(old)}, new {len(new)})"
    )


def test_a_merge_killed_mid_publish_leaves_the_old_or_the_new_tree(tmp_path: Path) -> None:
    """20,000 files, the writer SIGKILLed the moment the target
    changes. It used to hold 19,995 old and 5 new files; now the whole new tree is in
    place when anything is, and the next writer removes what the dead one left."""
    n = 20_000
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


TAGS, ROUNDS = ("t0", "t1", "t2"), 3
TAGS, ROUNDS = ("t0", "t1", "t2"), 3


def assert_all_merged(target: Path, keep: bool, tags: tuple[str, ...] = TAGS) -> None:
    """Every writer's last round is in, whole; ``common`` is one writer's."""
    got = file_contents(target)
    common = got.pop("common")
    assert common in {race_files(tag, ROUNDS - 1)["common"] for tag in tags}
    expected: dict[str, bytes | str] = {"keep": b"mine"} if keep else {}
    for tag in tags:
        last = race_files(tag, ROUNDS - 1)
        del last["common"]
        expected |= tree_of(last)
    assert got == expected
    assert leftovers(target.parent) == []


@pytest.mark.parametrize("keep", [False, True], ids=["fresh-target", "existing-target"])
def test_concurrent_merges_in_threads_each_publish_whole(tmp_path: Path, keep: bool) -> None:
    target = tmp_path / "out"
    if keep:
        put_files(target, {"keep": b"mine"})
    manifests = {tag: [build_manifest(race_files(tag, r)) for r in range(ROUNDS)] for tag in TAGS}
    start, errors = threading.Barrier(len(TAGS)), []

    def run(tag: str) -> None:
        try:
            start.wait(timeout=TIMEOUT)
            for manifest, chunks in manifests[tag]:
                write_tree(manifest, chunks, target)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in TAGS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert not errors, errors
    assert_all_merged(target, keep)


def test_concurrent_merges_in_processes_each_publish_whole(tmp_path: Path) -> None:
    """Processes racing for a fresh target: one publishes it by rename, the others
    merge into it, each whole (threads above cover an existing target too)."""
    target = tmp_path / "out"
    children = [Child("race", str(target), tag, str(ROUNDS)) for tag in TAGS]
    try:
        for child in children:
            child.wait_for("ready")
        for child in children:  # as close to together as processes get
            assert child.proc.stdin is not None
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
    finally:
        for child in children:
            child.finish()
    assert_all_merged(target, keep=False)


def version(tag: str, round_: int = 0) -> dict[str, bytes]:
    """One writer's version of a small tree: the same paths in every version, so the
    target after any merge is exactly the version merged last."""
    return {f"d{i}/f{j}": f"{tag} {round_} {i} {j}".encode() for i in range(4) for j in range(2)}


def test_a_writer_whose_target_is_swapped_during_its_check_publishes_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: a writer walked the existing target (the merge check) before taking the
    publish lock; another writer that swapped the target meanwhile removed the old
    tree under the walk, and the first one failed with a stray FileNotFoundError
    (about 1 in 2,000 writes of concurrent writers). Here the first writer is held in
    that walk, just before it enters a directory, while the second one publishes."""
    target = tmp_path / "out"
    put_files(target, version("old"))
    held, go, errors = threading.Event(), threading.Event(), []
    walk = merge.walk

    def held_walk(cursor: DirCursor) -> Iterator[Visit]:
        for visit in walk(cursor):
            yield visit
            mine = threading.current_thread().name == "held"
            if visit.event == "enter" and mine and not held.is_set():
                held.set()
                assert go.wait(TIMEOUT)

    def write_held() -> None:
        try:
            write_tree(*build_manifest(version("held")), target)
        except BaseException as e:
            errors.append(e)

    monkeypatch.setattr(merge, "walk", held_walk)
    writer = threading.Thread(target=write_held, name="held")
    writer.start()
    try:
        assert held.wait(TIMEOUT), "the writer never walked the target"
        write_tree(*build_manifest(version("other")), target)  # swaps, removes the old
        assert file_contents(target) == tree_of(version("other"))
    finally:
        go.set()
        writer.join(TIMEOUT)
    assert not errors, errors
    assert file_contents(target) == tree_of(version("held"))
    assert leftovers(tmp_path) == []


WRITERS, WRITES = 4, 50


def test_concurrent_writers_of_one_target_each_publish_a_whole_version(tmp_path: Path) -> None:
    """Many writers of one target in a loop (the race above, left to chance): every
    write publishes a whole version, and the target ends as exactly the version one
    writer wrote last."""
    target = tmp_path / "out"
    manifests = {
        f"w{k}": [build_manifest(version(f"w{k}", r)) for r in range(WRITES)]
        for k in range(WRITERS)
    }
    start, errors = threading.Barrier(WRITERS), []

    def run(tag: str) -> None:
        try:
            start.wait(timeout=TIMEOUT)
            for manifest, chunks in manifests[tag]:
                write_tree(manifest, chunks, target)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(tag,)) for tag in manifests]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=TIMEOUT)
    assert not errors, errors
    last = [tree_of(version(tag, WRITES - 1)) for tag in manifests]
    assert file_contents(target) in last
    assert leftovers(tmp_path) == []


def test_listings_and_writers_never_reclaim_a_live_writers_staging(tmp_path: Path) -> None:
    """What reclaims dead writers' staging (every node storage listing, every
    writer's clean-up of the parent) runs while writers in other processes and in
    this one publish into the same directory: no live writer's staging, lock file or
    publish lock is taken from it (each writer publishes every round, whole), and no
    listing shows a name the library made."""
    exp = tmp_path / "exp"
    exp.mkdir()
    children = [Child("race", str(exp / "out"), tag, str(ROUNDS)) for tag in TAGS]
    mine = ("m0", "m1")
    manifests = {tag: [build_manifest(race_files(tag, r)) for r in range(ROUNDS)] for tag in mine}
    errors: list[BaseException] = []
    writing = threading.Event()

    def write(tag: str) -> None:
        try:
            for manifest, chunks in manifests[tag]:
                write_tree(manifest, chunks, exp / "mine")
        except BaseException as e:
            errors.append(e)

    def list_while_writing() -> None:
        try:
            while writing.is_set():
                listed = DiskStorage().fs_list(str(tmp_path), str(exp), True, False)
                assert not [path for path, *_ in listed if ".air-" in path], listed
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=write, args=(tag,)) for tag in mine]
    listers = [threading.Thread(target=list_while_writing) for _ in range(2)]
    try:
        for child in children:
            child.wait_for("ready")
        writing.set()
        for t in listers + threads:
            t.start()
        for child in children:
            assert child.proc.stdin is not None
            child.proc.stdin.write("go\n")
            child.proc.stdin.flush()
    finally:
        for child in children:
            child.finish()
        for t in threads:
            t.join(timeout=TIMEOUT)
        writing.clear()
        for t in listers:
            t.join(timeout=TIMEOUT)
    assert not errors, errors
    assert_all_merged(exp / "out", keep=False)
    assert_all_merged(exp / "mine", keep=False, tags=mine)
