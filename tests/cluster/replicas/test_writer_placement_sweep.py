"""``placement="writer"``'s sweep of orphan blobs (``WriterPlacedHandler.sweep_placed``,
``air-transfer clean``): a writer killed after its holders committed and before its
stub leaves blobs that go from every holder, every named one staying byte for byte;
a live writer's blobs in that gap stay, and its write then commits whole; writes
committed while sweeps run read back whole; the stubs are listed only while no
change of the storage is in flight; a dry run removes nothing.

The writers here are ``PlacedUpload`` itself, run in an actor and stopped between
its two commits (its holders', then its stub's): the gap a sweep must judge."""

from __future__ import annotations

import json
import os
import signal
import threading
import uuid
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer.cli.main import main
from air_transfer.cluster.liveness import dead
from air_transfer.core.process_locks import Process
from air_transfer.storage.client import replica_set
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.placed_pending import Swept
from air_transfer.storage.client.placed_sums import write_sums
from air_transfer.storage.client.placed_upload import PlacedUpload, publish_stub
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.placed_record import (
    SUMS_SUFFIX,
    PlacedRecord,
    blob_dir,
    placed_root,
)
from air_transfer.storage.replica_wire import RegistryCalls
from tests.cluster.replicas.test_writer_placement import SHARD, fs_of, placed, write
from tests.support.checkpoints import on
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.replicas import top_up, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


@ray.remote(num_cpus=0)
class GapWriter:
    """A placed write stopped after its holders committed, before its stub."""

    def stage(self, fs: pafs.FileSystem, path: str, data: bytes) -> tuple[str, Process, int]:
        handler = node_storage_handler(fs)
        assert isinstance(handler, WriterPlacedHandler)
        self.handler, self.path = handler, path
        self.up = PlacedUpload(handler, path)  # held: never closed while this lives
        self.up.write(data)
        assert self.up.upload is not None
        self.up.upload.close()  # every holder commits its blob
        sums = self.up.summer.finish()
        up = self.up
        self.record = PlacedRecord(up.written, up.blob, tuple(up.holders), sums.digest())
        write_sums(handler, self.record, sums)  # and its checksums beside it
        from air_transfer.cluster.liveness import this_process

        return self.up.blob, this_process(), os.getpid()

    def finish(self) -> None:
        """The rest of ``PlacedUpload.close``: the stub, then the markers."""
        publish_stub(self.handler, self.path, self.record)
        self.handler.end_pending(self.up.holders, self.up.blob)


def placed_tree(tmp: Path) -> dict[str, bytes | None]:
    """Every entry under the nodes' placed roots: a file's bytes, None for a directory."""
    copies, out = tmp / "copies", {}
    for entry in os.listdir(copies):
        if entry.endswith(".placed"):
            for base, dirs, files in os.walk(copies / entry):
                out.update({os.path.join(base, d): None for d in dirs})
                out.update({os.path.join(base, f): Path(base, f).read_bytes() for f in files})
    return out


def named_files(h: WriterPlacedHandler, count: int) -> dict[str, bytes]:
    """``count`` placed files written whole, each from another worker node."""
    fs = fs_of(h)
    fs.create_dir(f"{h.root}/ckpt")
    data = {f"{h.root}/ckpt/f{i}": os.urandom(SHARD + i) for i in range(count)}
    nodes = workers()
    ray.get(
        [
            write.options(**on(nodes[i % len(nodes)])).remote(fs, p, d)
            for i, (p, d) in enumerate(data.items())
        ]
    )
    return data


def entries(capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    """The entries ``clean --json`` printed (after any line Ray's log put first)."""
    out = capsys.readouterr().out
    found: list[dict[str, Any]] = json.loads(out[out.index("{\n") :])["entries"]
    return found


def gap_writer(node: str) -> Any:
    return GapWriter.options(**on(node)).remote()  # type: ignore[attr-defined]


def test_a_killed_writers_blobs_go_from_every_holder(
    replica_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    kept = named_files(h, 3)
    writer = gap_writer(workers()[1])
    orphan = os.urandom(SHARD)
    blob, process, pid = ray.get(writer.stage.remote(fs_of(h), f"{h.root}/ckpt/lost", orphan))
    before = placed_tree(tmp_path)
    doomed = {p for p in before if blob in p and not p.endswith(SUMS_SUFFIX)}
    assert sum(before[p] == orphan for p in doomed) == 2  # both holders committed it
    assert sum(p.endswith(SUMS_SUFFIX) for p in before if blob in p) == 2  # its checksums
    pending = {p for p in before if ".writer-" in p}
    assert pending == doomed - {p for p in doomed if before[p]}  # finished writes: none
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: dead({process}), "the killed writer known dead")
    # A dry run says what would go, with its bytes, and removes nothing.
    assert main(["clean", h.root, "--dry-run", "--json"]) == 0
    said = entries(capsys)
    going = {e["path"]: e for e in said if e["kind"].startswith("placed")}
    assert set(going) == doomed
    assert all(e["action"] == "would remove" for e in going.values())
    assert sorted(e["bytes"] for e in going.values()) == [0, 0, SHARD, SHARD]
    assert placed_tree(tmp_path) == before
    # The clean removes them on every holder; every other entry stays, byte for byte.
    assert main(["clean", h.root, "--json"]) == 0
    done = entries(capsys)
    assert {e["path"]: e["action"] for e in done if e["kind"].startswith("placed")} == {
        p: "removed" for p in doomed
    }
    after = placed_tree(tmp_path)
    assert after == {p: b for p, b in before.items() if blob not in p}  # its checksums too
    for path, data in kept.items():
        assert read(fs_of(h), path) == data
    assert fs_of(h).get_file_info(f"{h.root}/ckpt/lost").type == pafs.FileType.NotFound
    assert h.sweep_placed() == []  # nothing left to sweep


def test_a_live_writers_blobs_stay_and_its_write_commits(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    writer = gap_writer(workers()[2])
    data = os.urandom(SHARD)
    h_fs = fs_of(h)
    h_fs.create_dir(f"{h.root}/ckpt")
    blob, _, _ = ray.get(writer.stage.remote(h_fs, f"{h.root}/ckpt/f", data))
    before = placed_tree(tmp_path)
    swept = h.sweep_placed()
    assert [s.action.startswith("kept: its writer") for s in swept] == [True, True]
    assert {s.path for s in swept} == {p for p in before if p.endswith(blob)}
    assert placed_tree(tmp_path) == before
    ray.get(writer.finish.remote())
    assert read(h_fs, f"{h.root}/ckpt/f") == data
    assert not [p for p in placed_tree(tmp_path) if ".writer-" in p]  # none pending now
    assert h.sweep_placed() == []  # named now, its markers gone
    assert read(h_fs, f"{h.root}/ckpt/f") == data
    ray.kill(writer)


def test_writes_committed_while_sweeps_run_read_back_whole(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    fs = fs_of(h)
    fs.create_dir(f"{h.root}/ckpt")
    writers = [gap_writer(n) for n in workers()[1:3]]
    data = [os.urandom(SHARD) for _ in writers]
    paths = [f"{h.root}/ckpt/f{i}" for i in range(len(writers))]
    ray.get([w.stage.remote(fs, p, d) for w, p, d in zip(writers, paths, data, strict=True)])
    stop, swept, rounds, errors = threading.Event(), [], [0], []

    def sweeps() -> None:
        try:
            while not stop.is_set():
                swept.extend(h.sweep_placed())
                rounds[0] += 1
        except Exception as e:  # the test's to raise
            errors.append(e)

    sweeper = threading.Thread(target=sweeps)
    sweeper.start()
    try:
        eventually(lambda: rounds[0] or errors, "a first sweep done")  # the commits race the next
        ray.get([w.finish.remote() for w in writers])
        count = rounds[0]
        eventually(lambda: rounds[0] > count + 1 or errors, "a whole sweep after the commits")
    finally:
        stop.set()
        sweeper.join()
    assert not errors
    assert all(s.action.startswith("kept") for s in swept)  # never a byte removed
    for path, d in zip(paths, data, strict=True):
        assert read(fs, path) == d
    for w in writers:
        ray.kill(w)


def in_line(key: str) -> bool:
    """Whether a change of the whole storage is in flight or waits for one: a change
    of another path than the one held then waits too (it is tried, and ended if not)."""
    probe = uuid.uuid4().hex
    got = replica_set.call(RegistryCalls.begin, key, ["elsewhere"], probe)
    if got is not None:
        replica_set.call(RegistryCalls.end, key, probe, [], [])
    return got is None


def test_the_stubs_are_listed_between_changes(replica_cluster: Cluster, tmp_path: Path) -> None:
    """A sweep with a blob to judge lists the stubs only once no change of the storage
    is in flight: a commit racing it cannot slip its stub past the listing."""
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    kept = named_files(h, 1)
    holder = Path(placed_root(h.replica_root, node_ids()["head"]), blob_dir(h.key))
    holder.mkdir(parents=True, exist_ok=True)
    orphan = holder / uuid.uuid4().hex  # as a delete that missed this holder leaves it
    orphan.write_bytes(os.urandom(SHARD))
    op = uuid.uuid4().hex
    replica_set.begin(h.key, ["ckpt/f0"], op)  # a change in flight, as a commit's
    swept: list[Swept] = []
    sweeper = threading.Thread(target=lambda: swept.extend(h.sweep_placed()))
    sweeper.start()
    try:
        eventually(lambda: in_line(h.key), "the sweep waiting for the change in flight")
        assert orphan.exists()  # nothing removed before the stubs are listed
    finally:
        replica_set.call(RegistryCalls.end, h.key, op, [], ["ckpt/f0"])
        sweeper.join()
    assert [(s.path, s.nbytes, s.action) for s in swept] == [(str(orphan), SHARD, "removed")]
    assert not orphan.exists()
    for path, data in kept.items():
        assert read(fs_of(h), path) == data
