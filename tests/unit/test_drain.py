"""The durable tier's drain, in this process against a local directory and a recording
filesystem (no Ray): every file there bit-identical with its record, the files that
name checkpoints after what they name, deletes applied after the uploads and never
while a last file names them, identical files copied inside the tier, files changed
between the two reads uploaded again, reads from the tier verified."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from air_transfer.errors import ChecksumError
from air_transfer.storage.durable.reads import TierReads, open_verified
from air_transfer.storage.durable.target import DurableTarget, is_staged
from air_transfer.storage.server.drain.scan import scan_storage
from tests.support.drains import SMALL, assert_same, drained, draining, local_target
from tests.support.recording_fs import RecordingHandler
from tests.support.trees import write_file
from tests.support.waiting import eventually


def _checkpoint(root: Path, name: str, seed: int, sizes: tuple[int, ...] = (5000, 200_000)) -> None:
    rng = random.Random(seed)
    for i, size in enumerate(sizes):
        write_file(root / name / f"part-{i}.bin", rng.randbytes(size))


def test_every_file_is_drained_bit_identical_with_its_record(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    _checkpoint(root, "run/checkpoint_0", 1, (0, 1, 65536, 65537, 300_000))
    (root / "run" / "empty_dir").mkdir()
    write_file(root / "run" / "ünïcode 模型.json", b"{}")
    with draining(root, target) as drainer:
        status = drained(drainer)
    assert_same(root, target)
    assert (tmp_path / "durable" / "run" / "empty_dir").is_dir()
    assert status.uploaded_bytes == sum(f.stat().st_size for f in root.rglob("*") if f.is_file())
    listed = TierReads(target).listing("", True, set())
    assert listed is not None
    assert {rel for rel, kind, _, _ in listed if kind == pafs.FileType.File} == {
        str(f.relative_to(root)) for f in root.rglob("*") if f.is_file()
    }


def test_files_that_name_checkpoints_are_published_after_the_rest_of_their_pass(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    handler = RecordingHandler()
    (tmp_path / "durable").mkdir()
    target = DurableTarget.parse((pafs.PyFileSystem(handler), str(tmp_path / "durable")))
    _checkpoint(root, "run/checkpoint_1", 2)
    write_file(root / "run" / "checkpoint_1" / ".metadata", b"dcp metadata")
    write_file(root / "run" / "checkpoint_manager_snapshot.json", b'{"checkpoint_1": 1}')
    with draining(root, target) as drainer:
        drained(drainer)
    published = [
        target.rel(p)
        for p in handler.published
        if not is_staged(os.path.basename(p)) and "/.air-transfer/" not in p
    ]
    last = {"run/checkpoint_1/.metadata", "run/checkpoint_manager_snapshot.json"}
    assert set(published[-2:]) == last, published
    assert set(published[:-2]) == {"run/checkpoint_1/part-0.bin", "run/checkpoint_1/part-1.bin"}


def test_a_last_file_too_large_to_hold_is_still_uploaded_after_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from air_transfer.storage.server.drain import scan

    monkeypatch.setattr(scan, "LAST_FILE_MAX_BYTES", 100)
    root = tmp_path / "root"
    handler = RecordingHandler()
    (tmp_path / "durable").mkdir()
    target = DurableTarget.parse((pafs.PyFileSystem(handler), str(tmp_path / "durable")))
    _checkpoint(root, "ckpt", 8)
    write_file(root / "ckpt" / ".metadata", b"m" * 1000)
    with draining(root, target) as drainer:
        drained(drainer)
    published = [target.rel(p) for p in handler.published if not is_staged(os.path.basename(p))]
    published = [p for p in published if not p.startswith(".air-transfer/")]
    assert published[-1] == "ckpt/.metadata", published
    assert_same(root, target)


def test_a_delete_is_applied_after_the_uploads_and_waits_while_a_last_file_names_it(
    tmp_path: Path,
) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    _checkpoint(root, "run/checkpoint_1", 3)
    snapshot = root / "run" / "checkpoint_manager_snapshot.json"
    write_file(snapshot, b'{"latest": "checkpoint_1"}')
    with draining(root, target) as drainer:
        drained(drainer)
        _checkpoint(root, "run/checkpoint_2", 4)
        # Ray Train deletes the old checkpoint before the snapshot naming it is
        # replaced here: the delete must wait while the tier's snapshot names it.
        drainer.tombstones.add("run/checkpoint_1")
        for f in (root / "run" / "checkpoint_1").iterdir():
            f.unlink()
        (root / "run" / "checkpoint_1").rmdir()
        status = drained(drainer)
        assert status.deletes_pending == 1
        assert (tmp_path / "durable" / "run" / "checkpoint_1" / "part-1.bin").is_file()
        write_file(snapshot, b'{"latest": "checkpoint_2"}')
        status = drained(drainer)
    assert status.deletes_pending == 0
    assert not (tmp_path / "durable" / "run" / "checkpoint_1").exists()
    assert_same(root, target)


def test_a_path_made_again_after_its_delete_keeps_its_new_files(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    _checkpoint(root, "ckpt", 5, (1000, 2000))
    with draining(root, target) as drainer:
        drained(drainer)
        drainer.tombstones.add("ckpt")
        (root / "ckpt" / "part-0.bin").unlink()  # the directory is made again: one file
        write_file(root / "ckpt" / "part-1.bin", b"new")
        status = drained(drainer)
    assert status.deletes_pending == 0
    assert_same(root, target)


def test_a_file_replaced_after_the_scan_is_uploaded_as_it_is_now(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    write_file(root / "a.bin", b"1" * 100_000)
    with draining(root, target) as drainer:
        drained(drainer)
        for version in range(2, 6):  # each write replaces the file, as node storage's do
            write_file(root / "a.tmp", str(version).encode() * 100_000)
            os.replace(root / "a.tmp", root / "a.bin")
            drained(drainer)
    assert_same(root, target)


def test_reads_from_the_tier_are_verified_chunk_by_chunk(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    data = random.Random(7).randbytes(3 * SMALL.chunk_bytes + 17)
    write_file(root / "shard.bin", data)
    with draining(root, target) as drainer:
        drained(drainer)
    record = TierReads(target).record("shard.bin")
    assert record is not None
    reader = open_verified(target, "shard.bin", record)
    reader.seek(SMALL.chunk_bytes + 5)
    assert reader.read(100) == data[SMALL.chunk_bytes + 5 : SMALL.chunk_bytes + 105]
    stored = tmp_path / "durable" / "shard.bin"
    with open(stored, "r+b") as f:  # one bit of the third chunk flipped in the tier
        f.seek(2 * SMALL.chunk_bytes + 3)
        byte = f.read(1)
        f.seek(2 * SMALL.chunk_bytes + 3)
        f.write(bytes([byte[0] ^ 1]))
    reader = open_verified(target, "shard.bin", record)
    assert reader.read(SMALL.chunk_bytes) == data[: SMALL.chunk_bytes]
    reader.seek(2 * SMALL.chunk_bytes)
    with pytest.raises(ChecksumError, match="chunk 2"):
        reader.read(10)


def test_a_bad_durable_tier_is_refused_at_construction(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a URI"):
        DurableTarget.parse("nosuchscheme://bucket/x")
    with pytest.raises(ValueError, match="not the root"):
        DurableTarget.parse("file:///")
    with pytest.raises(ValueError, match="does not exist"):
        DurableTarget.parse(f"file://{tmp_path}/missing/parent/base").check()
    with pytest.raises(TypeError, match="URI"):
        DurableTarget.parse(42)


def test_a_copy_that_does_not_lead_never_drains_until_it_does(tmp_path: Path) -> None:
    """A replicated storage's copies each run a drain; only the leading one uploads
    (a stale copy may lack a change), and another takes over once it leads."""
    import threading

    from air_transfer.storage.durable.tombstones import MemoryTombstones
    from air_transfer.storage.replica_wire import drain_leader
    from air_transfer.storage.server.drain.loop import Drainer
    from air_transfer.storage.server.drain.passes import Drain

    assert drain_leader({"b", "a"}, "b") == "b"  # the storage node's, while fresh
    assert drain_leader({"c", "a"}, "b") == "a"  # else the first fresh copy
    assert drain_leader(set(), "b") is None
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    write_file(root / "a.bin", b"a" * 1000)
    leading, asked = threading.Event(), []

    def leads() -> bool:
        asked.append(leading.is_set())
        return leading.is_set()

    work = Drain(str(root), target, SMALL, MemoryTombstones(), threading.Lock())
    drainer = Drainer(work, leads)
    drainer.start()
    try:
        ticket = drainer.request()
        eventually(lambda: len(asked) >= 2, "the drain to ask twice whether it leads", 30)
        assert drainer.status().completed < ticket  # it was asked, and did nothing
        assert not (tmp_path / "durable" / "a.bin").exists()
        leading.set()
        drained(drainer)
    finally:
        drainer.stop()
    assert_same(root, target)


def test_the_scan_sees_files_and_empty_dirs_but_no_link_and_no_internal_name(
    tmp_path: Path,
) -> None:
    """What the drain uploads: regular files and directories without files, never
    what a symlink leads to (inside or outside the root) nor the library's own
    names (a trash directory's files, a replica's marker)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    write_file(outside / "secret", b"s")
    deep = "/".join(f"d{i}" for i in range(200))
    write_file(root / deep / "f", b"f")
    write_file(root / "run" / "a.bin", b"a")
    (root / "run" / "empty" / "nested").mkdir(parents=True)
    write_file(root / "run" / ".air-trash-1" / "gone", b"g")
    write_file(root / ".air-replica-x", b"marker")
    (root / "run" / "out").symlink_to(outside)
    (root / "run" / "in").symlink_to(root / deep)
    scanned = scan_storage(str(root))
    assert set(scanned.files) == {f"{deep}/f", "run/a.bin"}
    assert scanned.empty_dirs == {"run/empty/nested"}
    assert scanned.files["run/a.bin"].size == 1
    assert scan_storage(str(tmp_path / "gone")).files == {}


def test_a_delete_waits_only_for_a_last_file_that_names_its_path(tmp_path: Path) -> None:
    """A file uploaded last names what lies under its own directory, by the path
    from there (Train's run state its checkpoints, DCP's ``.metadata`` its shards):
    another checkpoint's ``.metadata`` naming a shard of the same name does not hold
    back the delete of this checkpoint's shard."""
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    for name in ("ckpt_a", "ckpt_b"):
        write_file(root / name / "__0_0.distcp", name.encode() * 100)
        write_file(root / name / ".metadata", b"shards: __0_0.distcp")
    with draining(root, target) as drainer:
        drained(drainer)
        drainer.tombstones.add("ckpt_b/__0_0.distcp")
        (root / "ckpt_b" / "__0_0.distcp").unlink()
        status = drained(drainer)
        assert status.deletes_pending == 1  # its own .metadata still names it
        (root / "ckpt_b" / ".metadata").write_bytes(b"shards: none")
        status = drained(drainer)
    assert status.deletes_pending == 0  # ckpt_a's .metadata never held it back
    assert not (tmp_path / "durable" / "ckpt_b" / "__0_0.distcp").exists()
    assert_same(root, target)


def test_a_path_a_metric_recorded_or_a_longer_name_never_holds_a_delete_back(
    tmp_path: Path,
) -> None:
    """Train's run state names the checkpoints it tracks by their directory's name; a
    metric holding the absolute path a run restored from, or a checkpoint whose name
    only starts with the deleted one's, is no mention of it: the delete goes."""
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    for name in ("checkpoint_1", "checkpoint_10"):
        _checkpoint(root, f"run/{name}", 5)
    snapshot = root / "run" / "checkpoint_manager_snapshot.json"
    write_file(snapshot, b'{"dir": "checkpoint_1"}')
    with draining(root, target) as drainer:
        drained(drainer)
        mentions = f'{{"dir": "checkpoint_10", "restored_path": "{root}/run/checkpoint_1"}}'
        write_file(snapshot, mentions.encode())
        drained(drainer)
        drainer.tombstones.add("run/checkpoint_1")
        for f in (root / "run" / "checkpoint_1").iterdir():
            f.unlink()
        (root / "run" / "checkpoint_1").rmdir()
        status = drained(drainer)
    assert status.deletes_pending == 0
    assert not (tmp_path / "durable" / "run" / "checkpoint_1").exists()
    assert_same(root, target)
