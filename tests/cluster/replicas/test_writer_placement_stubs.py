"""``placement="writer"``'s stubs known out of band: a stub is what the storage node
marked one when it committed it, never what a file's bytes say; every server-side
read of a stub (a plain storage's read on this node or another, a server-side copy,
a directory transfer) refuses it, naming ``placement='writer'``, rather than hand
out its record and zeros; a forged record is refused; a re-made copy keeps stubs
as stubs."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray
from ray.cluster_utils import Cluster
from ray.train import Checkpoint

from air_transfer import TransferConfig, storage_filesystem
from air_transfer.cli.main import main
from air_transfer.core.placed_mark import MARK, MARK_VALUE, is_stub
from air_transfer.storage.client.placed_sums import write_sums
from air_transfer.storage.client.placed_upload import PlacedUpload, publish_stub
from air_transfer.storage.node_api import NodeFiles, NodeReads
from air_transfer.storage.placed_record import PlacedRecord, placed_root
from air_transfer.train import hooks
from tests.cluster.replicas.test_writer_placement import (
    SHARD,
    allocated,
    blobs,
    fs_of,
    placed,
    write,
)
from tests.support.checkpoints import on
from tests.support.cluster import node_ids
from tests.support.node_storage import CONFIG, read
from tests.support.replicas import copies_identical, fresh_roots, remove, top_up, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

SUMS = "0" * 64
REFUSED = r"placed file of node storage with placement='writer'"


@ray.remote(num_cpus=0)
def read_there(fs: pafs.FileSystem, path: str) -> bytes:
    return read(fs, path)


def test_server_side_reads_of_a_stub_are_refused(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    fs = fs_of(h)
    data = os.urandom(SHARD)
    fs.create_dir(f"{h.root}/ckpt")
    with fs.open_output_stream(f"{h.root}/ckpt/shard") as out:
        out.write(data)
    # The same root as a storage of its own, as a tool or another run would open it.
    plain = storage_filesystem(node=node_ids()["head"], config=CONFIG, root=h.root)
    path = f"{h.root}/ckpt/shard"
    with pytest.raises(OSError, match=REFUSED) as here:  # on the storage node: its disk
        read(plain, path)
    assert "ckpt/shard" in str(here.value)
    remote = read_there.options(**on(workers()[1])).remote(plain, path)  # file chunks
    with pytest.raises(OSError, match=REFUSED):
        ray.get(remote)
    with pytest.raises(OSError, match=REFUSED):  # a server-side copy
        plain.copy_file(path, f"{h.root}/ckpt/copied")
    with pytest.raises(OSError, match=REFUSED) as transfer:  # a restore's directory transfer
        h.link.call(NodeReads.directory_transfer, h.root, f"{h.root}/ckpt", TransferConfig())
    assert "ckpt/shard" in str(transfer.value)
    assert read(fs, path) == data  # through the placed storage: the bytes


def test_bytes_that_look_like_a_record_are_a_files_own(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    copy = workers()[0]
    h = placed(tmp_path, "head", named=(copy,))
    fs = fs_of(h)
    with fs.open_output_stream(f"{h.root}/placed") as out:
        out.write(os.urandom(SHARD))
    # A file written by another route whose bytes are a stub's, record and all.
    look_alike = Path(h.root, "placed").read_bytes()
    for root in fresh_roots(h).values():
        shutil.copyfile(Path(root, "placed"), Path(root, "look-alike"))
        assert not is_stub(str(Path(root, "look-alike")))
    assert read(fs, f"{h.root}/look-alike") == look_alike


@pytest.mark.parametrize("forged", ["blob leaving the placed root", "holder elsewhere"])
def test_a_forged_record_is_refused(replica_cluster: Cluster, tmp_path: Path, forged: str) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    here = node_ids()["head"]
    secret = tmp_path / "elsewhere" / ("a" * 24) / ("b" * 32)
    secret.parent.mkdir(parents=True)
    secret.write_bytes(os.urandom(SHARD))
    if forged == "holder elsewhere":
        elsewhere = ((here, str(secret.parents[1])),)
        record = PlacedRecord(SHARD, "a" * 24 + "/" + "b" * 32, elsewhere, SUMS)
    else:
        rel = os.path.relpath(secret, placed_root(h.replica_root, here))
        record = PlacedRecord(SHARD, rel, ((here, placed_root(h.replica_root, here)),), SUMS)
    head = record.encode()
    for root in fresh_roots(h).values():
        stub = Path(root, "forged")
        stub.write_bytes(head + bytes(SHARD - len(head)))
        os.setxattr(stub, MARK, MARK_VALUE)  # as if the storage node had marked it
    with pytest.raises(ValueError, match=r"record of .*forged.* is not valid.*refused"):
        read(fs_of(h), f"{h.root}/forged")


def test_a_remade_copy_keeps_stubs_as_stubs(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 5)
    w = workers()
    h = placed(tmp_path, "head", named=(w[0],))
    fs = fs_of(h)
    data = os.urandom(SHARD)
    ray.get(write.options(**on(w[1])).remote(fs, f"{h.root}/f", data))
    held_before = blobs(tmp_path)
    remove(replica_cluster, node_ids()[w[0]])
    copies_identical(h, 2)  # re-made on a live node
    for root in fresh_roots(h).values():
        stub = Path(root, "f")
        assert stub.stat().st_size == SHARD
        assert allocated(root) < SHARD // 2, root  # sparse, as written
        assert is_stub(str(stub)), root
    assert read(fs, f"{h.root}/f") == data
    # The holders' bytes are not the copy's: a live holder's blob is as it was, and a
    # lost holder is replaced by the registry's background pass with the same bytes.
    live = set(node_ids().values())

    def all_live() -> PlacedRecord | None:
        r = h.record_of(f"{h.root}/f")
        return r if r is not None and all(n in live for n, _ in r.holders) else None

    record = eventually(all_live, "every holder of f live")
    now = blobs(tmp_path)
    for node, blob in held_before.items():
        if node in live:
            assert now[node] == blob, node
    for node, root in record.holders:
        assert (Path(root) / record.blob).read_bytes() == data, node


def test_a_races_loser_leaves_no_blob_and_a_blob_awaiting_its_stub_stays(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    """Two writers of one path, both with their holders committed, their stubs not
    yet (as the registry orders racing commits, one at a time, whatever each read
    before): the first stub published leaves the other's blob, whose stub is about
    to be committed, alone; the second replaces it and deletes the loser's blob."""
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    path = f"{h.root}/f"
    data = {"first": os.urandom(SHARD), "second": os.urandom(SHARD)}
    uploads = {name: PlacedUpload(h, path) for name in data}
    for name, upload in uploads.items():
        upload.write(data[name])
        assert upload.upload is not None
        upload.upload.close()  # every holder has committed its blob
    records = {}
    for name, u in uploads.items():
        sums = u.summer.finish()
        records[name] = PlacedRecord(SHARD, u.blob, tuple(u.holders), sums.digest())
        write_sums(h, records[name], sums)
    loser, winner = records["first"], records["second"]
    publish_stub(h, path, loser)
    assert all(Path(winner.where(x)).read_bytes() == data["second"] for x in winner.holders)
    publish_stub(h, path, winner)
    assert not any(Path(loser.where(x)).exists() for x in loser.holders)
    assert read(fs_of(h), path) == data["second"]
    assert sorted(b for bs in blobs(tmp_path).values() for b in bs) == [data["second"]] * 2
    for upload in uploads.values():  # published by hand above: closed publishing nothing
        upload.failed = True
        upload.close()


def test_a_lost_holder_is_replaced_by_a_live_one(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 5)
    w = workers()
    h = placed(tmp_path, "head", named=(w[0],))
    fs = fs_of(h)
    data, path = os.urandom(SHARD), f"{h.root}/d/f"
    fs.create_dir(f"{h.root}/d")
    writer = ray.get(write.options(**on(w[1])).remote(fs, path, data))
    before = h.record_of(path)
    assert before is not None and writer in dict(before.holders)
    stale = pytest.raises(OSError, match="no longer the placed file")
    with stale:  # a swap of a stub that is not (or no longer) the one read
        h.link.call(NodeFiles.fs_swap_stub, h.root, path, b"another record", b"x", "")
    remove(replica_cluster, writer)
    # The registry's background pass may repair it first: either way, K holders after.
    assert h.repair_holders(h.root) in ([path], [])
    after = h.record_of(path)
    assert after is not None and after.blob == before.blob
    live = set(node_ids().values())
    assert len(after.holders) == 2 and {n for n, _ in after.holders} <= live
    for holder in after.holders:  # every holder's blob byte-identical
        assert Path(after.where(holder)).read_bytes() == data
    for root in fresh_roots(h).values():  # every copy's stub names them, still a stub
        assert is_stub(str(Path(root, "d", "f")))
        assert allocated(root) < SHARD // 2
    assert read(fs, path) == data
    assert h.repair_holders(h.root) == []  # nothing left to repair


def test_the_cli_verifies_placed_files_and_a_copy_and_a_drain_refuse_them(
    replica_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    fs = fs_of(h)
    fs.create_dir(f"{h.root}/ckpt")
    with fs.open_output_stream(f"{h.root}/ckpt/shard") as out:
        out.write(os.urandom(SHARD))
    assert main(["verify", h.root, "ckpt"]) == 0  # its holders checked, not its stubs read
    assert "ckpt: verified" in capsys.readouterr().out
    backup = tmp_path / "backup"
    assert main(["cp", f"node://{h.root}/ckpt", f"file://{backup}"]) == 1
    assert "placement='writer'" in capsys.readouterr().err
    assert not (backup / "shard").exists()
    tier = (pafs.LocalFileSystem(), str(tmp_path / "tier"))
    draining = storage_filesystem(node=node_ids()["head"], config=CONFIG, root=h.root, durable=tier)
    refused = r"placement='writer'.*cannot drain it without its replica_root"
    with pytest.raises(ValueError, match=refused):
        draining.get_file_info(f"{h.root}/ckpt")  # its first call attaches the drain


@ray.remote(num_cpus=0)
class OpenWriter:
    """A writer that stages a placed file on its holders and dies before closing it."""

    def start(self, fs: pafs.FileSystem, path: str) -> None:
        self.out = fs.open_output_stream(path)
        self.out.write(os.urandom(2 * SHARD))


def placed_files(tmp: Path) -> list[str]:
    """Every file under the nodes' placed roots (named only: an agent may remove one
    while it is listed)."""
    copies = tmp / "copies"
    return sorted(
        os.path.join(base, f)
        for entry in os.listdir(copies)
        if entry.endswith(".placed")
        for base, _, files in os.walk(copies / entry)
        for f in files
    )


def test_a_dead_writers_staging_files_go_from_its_holders(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    writer = OpenWriter.options(**on(workers()[1])).remote()  # type: ignore[attr-defined]
    ray.get(writer.start.remote(fs_of(h), f"{h.root}/f"))
    assert len(placed_files(tmp_path)) == 2  # staged on both holders
    ray.kill(writer)
    eventually(lambda: placed_files(tmp_path) == [], "the dead writer's staging files removed")
    assert fs_of(h).get_file_info(f"{h.root}/f").type == pafs.FileType.NotFound


def test_a_stopped_rounds_report_leaves_no_stub_nor_blob(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    """Train's hooks as a round runs: each report into writer-placed storage is
    copied by Ray itself (the hook stores nothing) but noted; when Train stops the
    group, what it does not track goes, stubs and holders' bytes both."""
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    fs = fs_of(h)
    local = tmp_path / "local"
    local.mkdir()
    fs.create_dir(f"{h.root}/run")
    reports = {step: f"{h.root}/run/checkpoint_{step}" for step in ("tracked", "stopped")}
    data = {step: os.urandom(SHARD) for step in reports}
    for step, report in reports.items():
        assert hooks.upload_directory(fs, report, Checkpoint(str(local)), "worker-1") is None
        fs.create_dir(report)  # as Ray's own copy makes and writes it
        with fs.open_output_stream(f"{report}/shard") as out:
            out.write(data[step])
    hooks.reclaim_reports(fs, ["worker-1"], [reports["tracked"]])
    assert fs.get_file_info(reports["stopped"]).type == pafs.FileType.NotFound
    assert read(fs, f"{reports['tracked']}/shard") == data["tracked"]
    assert sorted(b for bs in blobs(tmp_path).values() for b in bs) == [data["tracked"]] * 2


def test_a_moved_stub_stays_a_stub(replica_cluster: Cluster, tmp_path: Path) -> None:
    """The mark is the file's, not its path's: a move keeps it on every copy."""
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    fs = fs_of(h)
    data = os.urandom(SHARD)
    fs.create_dir(f"{h.root}/a")
    with fs.open_output_stream(f"{h.root}/a/f") as out:
        out.write(data)
    fs.move(f"{h.root}/a", f"{h.root}/b")
    for root in fresh_roots(h).values():
        assert is_stub(str(Path(root, "b", "f"))), root
    assert read(fs, f"{h.root}/b/f") == data
