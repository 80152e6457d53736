"""Node storage against an attacker on the storage node: while the calls run in a loop,
a thread flips a directory on the way of every path between a real directory and a
symlink to a directory outside the root (one atomic exchange at a time). Defect: the
storage-node writes, Train's report and restore hooks and the agent's directory
transfers checked a path, then acted on it by path again, so a flip in between led
them out of the root: files created outside, checkpoints published outside, outside
files read and handed out.

Whatever the interleaving, nothing outside may be created, changed or read: every
call acts inside the root, or fails with a clear error (the path led outside when it
was resolved: PermissionError; caught mid-flip: FileNotFoundError,
NotADirectoryError, or ELOOP once re-resolving kept meeting a change). The outside
directory mirrors the inside one, same names and sizes, so that a call led there
would find what it expects."""

from __future__ import annotations

import errno
import os
import random
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.train import Checkpoint

from air_transfer import ChunkedCheckpoint, TransferConfig, storage_filesystem
from air_transfer.layout import Source, scan
from air_transfer.packing import ChunkPacker, ChunkPlan, read_chunks
from air_transfer.staging import exchange
from air_transfer.storage.disk import DiskStorage
from air_transfer.storage.disk_chunks import DirectoryTransfers, FileChunks
from air_transfer.storage.disk_reads import read_chunks as read_file_chunks
from air_transfer.storage.disk_uploads import DiskUploads
from air_transfer.storage.same_node import SameNodeWriter, open_native
from air_transfer.storage.sink import store_checkpoint
from air_transfer.train import download_directory, upload_directory

#: Calls per test: each flip lands somewhere in some of them.
ITERATIONS = 150
SIZE = 3000
INSIDE, SECRET = b"inside".ljust(SIZE, b"."), b"SECRET".ljust(SIZE, b".")
#: Only outside: no listing, scan or copy may ever show it.
PLANTED = "planted-outside"
CHUNK = 1024
#: How often the attacker and the caller may take turns (Python's default: 5 ms).
SWITCH_S = 1e-5


class Disk(DiskStorage, DiskUploads):
    """The disk services the node agent runs, minus the actor."""


@dataclass
class Attack:
    root: Path  # the storage root; root/d is the directory that flips
    outside: Path
    d: Path
    alt: Path  # what root/d is exchanged with: a symlink to outside, or d itself
    before: dict[str, Any] = field(default_factory=dict)
    flips: int = 0

    @property
    def r(self) -> str:
        return str(self.root)


def populate(top: Path, body: bytes) -> None:
    (top / "ckpt" / "sub").mkdir(parents=True)
    (top / "ckpt" / "a").write_bytes(body)
    (top / "ckpt" / "sub" / "b").write_bytes(body)
    (top / "f").write_bytes(body)
    (top / "exp").mkdir()


def state(top: Path) -> dict[str, Any]:
    """Every entry under ``top``: kind, mode, mtime (a directory's changes with every
    entry made, renamed or removed in it) and a file's bytes."""
    found: dict[str, Any] = {}
    for path in [top, *top.rglob("*")]:
        st = path.lstat()
        body = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        found[str(path.relative_to(top))] = (st.st_mode, st.st_mtime_ns, body)
    return found


@pytest.fixture
def attack(tmp_path: Path) -> Attack:
    root, outside = tmp_path / "root", tmp_path / "outside"
    populate(root / "d", INSIDE)
    populate(outside, SECRET)
    (outside / PLANTED).write_bytes(SECRET)
    (outside / "ckpt" / PLANTED).write_bytes(SECRET)
    (root / "alt").symlink_to(outside)
    a = Attack(root, outside, root / "d", root / "alt")
    a.before = state(outside)
    return a


class Attacker:
    """A thread that, during each call, exchanges ``root/d`` with the symlink
    ``root/alt`` (``root/d`` then leads outside) and back a moment later: at a random
    point of the call and for a random while, both counted in system calls of its
    own (not time), spread over how long the calls have lasted so far. So some calls
    see no flip, some one in any of their steps, some both flips."""

    def __init__(self, a: Attack) -> None:
        self.a, self.random = a, random.Random(0)
        self.go, self.done, self.idle = threading.Event(), threading.Event(), threading.Event()
        self.stopping = False
        self.span = 64  # system calls of the attacker during a call, a running average
        self.thread = threading.Thread(target=self._run, name="attacker", daemon=True)
        self.thread.start()

    def during(self, call: Callable[[], object]) -> None:
        """Run ``call`` while attacking; return once ``root/d`` is the directory again."""
        self.idle.clear()
        self.go.set()
        try:
            call()
        finally:
            self.done.set()
            self.idle.wait()

    def stop(self) -> None:
        self.stopping = True
        self.go.set()
        self.thread.join()

    def _flip(self) -> None:
        exchange(str(self.a.d), str(self.a.alt))

    def _run(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            if self.stopping:
                return
            start = self.random.randrange(self.span)
            end = start + self.random.randrange(1, self.span // 4 + 2)
            spins = 0
            while not self.done.is_set():
                if spins in (start, end):
                    self._flip()
                    self.a.flips += spins == start
                os.lstat(self.a.root)
                spins += 1
            if start < spins <= end:  # still leading outside: back
                self._flip()
            self.span = (self.span + spins) // 2 + 1
            self.done.clear()
            self.idle.set()


def outcome(call: Callable[[], object], unexpected: list[str]) -> str:
    """The outcome of ``call``: "ok", or the type of a clear error; anything else is
    recorded in ``unexpected``."""
    try:
        call()
        return "ok"
    except AssertionError:
        raise  # something outside was read
    except (PermissionError, FileNotFoundError, NotADirectoryError) as e:
        return type(e).__name__
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "ELOOP"
        unexpected.append(repr(e))
    except Exception as e:
        unexpected.append(repr(e))
    return "unexpected"


def attacked(
    a: Attack, call: Callable[[int], object], iterations: int = ITERATIONS
) -> Counter[str]:
    """``call(i)`` for each i under attack; the outcomes. Fails if anything outside
    changed, or a call raised an error that is not a clear refusal."""
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    attacker = Attacker(a)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)  # the two threads interleave finely
    try:
        for i in range(iterations):
            attacker.during(
                lambda i=i: outcomes.update([outcome(lambda: call(i), unexpected)])  # type: ignore[misc]
            )
    finally:
        sys.setswitchinterval(interval)
        attacker.stop()
    assert a.d.is_dir() and not a.d.is_symlink() and a.alt.is_symlink()
    after = state(a.outside)
    changed = sorted(k for k in {*a.before, *after} if a.before.get(k) != after.get(k))
    assert not changed, f"changed outside the root: {changed} ({outcomes}, {a.flips} flips)"
    assert not unexpected, f"unclear errors: {unexpected[:3]} ({outcomes})"
    return outcomes


def no_secret(data: bytes | Iterable[str]) -> None:
    if isinstance(data, bytes):
        assert SECRET[:6] not in data, "read a file outside the root"
    else:
        assert not [n for n in data if PLANTED in n], "listed a directory outside the root"


# -- the storage node's own calls, without Ray ----------------------------------------
@pytest.mark.parametrize("direct_io", [True, False])
def test_a_same_node_write_creates_nothing_outside(attack: Attack, direct_io: bool) -> None:
    """The staging file was created confined, then opened again by path (``O_CREAT``
    with direct I/O): a flip in between created it outside and wrote there."""
    config, r = TransferConfig(direct_io=direct_io), attack.r
    written: list[int] = []

    def write(i: int) -> None:
        local = f"{r}/d/exp/new{i}"
        staging, start, expect = DiskUploads().fs_open_write(r, local, False)
        writer = SameNodeWriter(r, local, staging, start, expect, config)
        try:
            writer.write(INSIDE)
        except BaseException:
            writer._discard()
            raise
        writer.close()
        written.append(i)

    attacked(attack, write, 3 * ITERATIONS)  # quick calls, with a narrow window each
    for i in written:
        assert (attack.d / "exp" / f"new{i}").read_bytes() == INSIDE


def test_metadata_and_file_reads_stay_inside(attack: Attack) -> None:
    """Every other operation of the storage node (metadata, file reads, copies): each
    acts inside or is refused."""
    disk, r = Disk(), attack.r

    def calls(i: int) -> None:
        no_secret(open_native(r, f"{r}/d/f").read())
        no_secret(b"".join(bytes(c) for c in read_file_chunks(r, f"{r}/d/f", SIZE, CHUNK, 0)))
        no_secret([rel for rel, *_ in disk.fs_list(r, f"{r}/d", True, False)])
        disk.fs_info(r, [f"{r}/d/f", f"{r}/d/ckpt"])
        disk.fs_create_dir(r, f"{r}/d/exp/m{i}/x", True)
        disk.fs_move(r, f"{r}/d/exp/m{i}", f"{r}/d/exp/n{i}")
        disk.fs_copy_file(r, f"{r}/d/f", f"{r}/d/exp/n{i}/c")
        disk.fs_delete_file(r, f"{r}/d/exp/n{i}/c")
        disk.fs_delete_dir_contents(r, f"{r}/d/exp/n{i}", False)
        disk.fs_delete_dir(r, f"{r}/d/exp/n{i}")

    attacked(attack, calls, ITERATIONS // 2)


class Packer:
    """Packs in this process what the agent would pack in its own tasks."""

    def __call__(self, source: Source, plans: Iterable[ChunkPlan]) -> tuple[list[Any], list[Any]]:
        chunks, checksums = ChunkPacker().pack(source, list(plans))
        return [bytes(c) for c in chunks], checksums


def test_file_chunks_for_other_nodes_are_read_inside(attack: Attack) -> None:
    """A file's chunks packed for readers on other nodes (``disk_chunks.FileChunks``)."""
    r = attack.r

    def read(i: int) -> None:
        pairs = FileChunks(Packer()).refs(r, f"{r}/d/f", SIZE, CHUNK, 0, 8, 1 << 20)
        no_secret(b"".join(chunk for chunk, _ in pairs))

    attacked(attack, read, 3 * ITERATIONS)  # quick calls, with a narrow window each


def test_a_directory_transfer_is_scanned_and_packed_inside(attack: Attack) -> None:
    """A checkpoint directory packed for Train's restores on other nodes
    (``disk_chunks.DirectoryTransfers``): confined, then scanned and read by path."""
    r = attack.r

    def start(source: Source, config: TransferConfig) -> tuple[Any, Any]:
        # What the agent's transfer does with the source: scan it, read its files.
        found = scan(source, config.follow_symlinks)
        no_secret([e.path for e in found.entries])
        views = read_chunks(
            source, found.files, found.stamps, CHUNK, lambda _, n: memoryview(bytearray(n))
        )
        packed = b"".join(bytes(view) for _, view in views)
        no_secret(packed)
        return packed, None

    attacked(attack, lambda i: DirectoryTransfers(start).ref(r, f"{r}/d/ckpt", TransferConfig()))


# -- Train's hooks and the storage sink, with Ray --------------------------------------
@pytest.fixture
def local_checkpoint(tmp_path: Path) -> Path:
    """A worker's checkpoint directory (not in the storage)."""
    src = tmp_path / "worker" / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(INSIDE)
    (src / "sub" / "b").write_bytes(INSIDE)
    return src


@pytest.mark.usefixtures("ray_local")
def test_train_report_on_the_storage_node_publishes_inside(
    attack: Attack, local_checkpoint: Path
) -> None:
    """Train's report hook on the storage node: checked, then ``write_tree`` by path."""
    fs, r = storage_filesystem(root=attack.r), attack.r
    published: list[int] = []

    def report(i: int) -> None:  # new targets, and merges into existing ones
        upload_directory(fs, f"{r}/d/exp/ck{i % 8}", Checkpoint(str(local_checkpoint)))
        published.append(i % 8)

    attacked(attack, report)
    for i in published:
        assert (attack.d / "exp" / f"ck{i}" / "sub" / "b").read_bytes() == INSIDE


@pytest.mark.usefixtures("ray_local")
def test_the_storage_sink_publishes_inside(attack: Attack, local_checkpoint: Path) -> None:
    """The sink (a report from another node, ``checkpoint_upload_fn``): checked, then
    the transfer written by path."""
    fs, r = storage_filesystem(root=attack.r), attack.r
    handle = ChunkedCheckpoint.from_directory(local_checkpoint).pack()
    published: list[int] = []

    def store(i: int) -> None:
        store_checkpoint(handle, fs, f"{r}/d/exp/s{i % 8}")
        published.append(i % 8)

    attacked(attack, store, ITERATIONS // 5)
    for i in published:
        assert (attack.d / "exp" / f"s{i}" / "sub" / "b").read_bytes() == INSIDE


@pytest.mark.usefixtures("ray_local")
def test_train_restore_on_the_storage_node_reads_inside(attack: Attack, tmp_path: Path) -> None:
    """Train's restore hook on the storage node: checked, then ``copy_tree`` by path."""
    fs, r = storage_filesystem(root=attack.r), attack.r
    assert ray.is_initialized()

    def restore(i: int) -> None:
        target = tmp_path / "restored" / str(i)
        if download_directory(fs, f"{r}/d/ckpt", str(target)):
            no_secret([str(p) for p in target.rglob("*")])
            for p in target.rglob("*"):
                if p.is_file():
                    no_secret(p.read_bytes())

    attacked(attack, restore)


@pytest.mark.usefixtures("ray_local")
def test_a_report_into_the_storage_root_itself_is_refused(
    attack: Attack, local_checkpoint: Path
) -> None:
    """Defect: a checkpoint written at the root itself was staged and swapped in from
    the root's parent directory, outside the root."""
    fs, parent = storage_filesystem(root=attack.r), attack.root.parent
    before = sorted(os.listdir(parent))
    with pytest.raises(PermissionError, match="storage root"):
        upload_directory(fs, attack.r, Checkpoint(str(local_checkpoint)))
    assert sorted(os.listdir(parent)) == before


@pytest.mark.usefixtures("ray_local")
def test_a_refused_report_names_the_storage_path(attack: Attack, local_checkpoint: Path) -> None:
    """The writer works through a held directory (``/proc/self/fd/...``): its errors
    still name the path in the storage."""
    fs = storage_filesystem(root=attack.r)
    with pytest.raises(NotADirectoryError) as caught:
        upload_directory(fs, f"{attack.r}/d/f", Checkpoint(str(local_checkpoint)))
    assert f"{attack.r}/d/f" in str(caught.value) and "/proc/" not in str(caught.value)
