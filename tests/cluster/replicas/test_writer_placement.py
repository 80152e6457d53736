"""``storage_filesystem(replicas=2, placement="writer")``: each file's bytes stay on
the node of the process that wrote it plus one other, the storage node and its copy
keeping only a stub of the file's size; a holder lost mid-write fails the write and
publishes nothing, a holder lost after it is read around, and two writers racing on
one path leave one whole version that every copy names."""

from __future__ import annotations

import gc
import logging
import os
import zlib
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer import storage_filesystem
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.placed_record import SUMS_SUFFIX, choose_holders, placed_root
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.node_storage import CONFIG, read
from tests.support.replicas import remove, top_up, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

SHARD = 3 * MiB + 5


def placed(tmp: Path, node: str = "head", named: tuple[str, ...] = ()) -> WriterPlacedHandler:
    """Writer-placed node storage on ``node``, its copy on ``named`` (or any)."""
    ids = node_ids()
    fs = storage_filesystem(
        node=ids[node],
        config=CONFIG,
        root=str(tmp / "copies" / ids[node]),
        replicas=2,
        replica_nodes=tuple(ids[n] for n in named),
        replica_root=str(tmp / "copies" / "{node_id}"),
        placement="writer",
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, WriterPlacedHandler)
    return handler


def fs_of(h: WriterPlacedHandler) -> pafs.FileSystem:
    return pafs.PyFileSystem(h)


@ray.remote(num_cpus=0)
def write(fs: pafs.FileSystem, path: str, data: bytes) -> str:
    with fs.open_output_stream(path) as out:
        for at in range(0, len(data), MiB):
            out.write(data[at : at + MiB])
    return str(ray.get_runtime_context().get_node_id())


def blobs(tmp: Path) -> dict[str, list[bytes]]:
    """Node id -> the contents of every blob under its placed root (not the
    checksums beside each)."""
    out: dict[str, list[bytes]] = {}
    for entry in os.listdir(tmp / "copies"):
        if entry.endswith(".placed"):
            for base, _, files in os.walk(tmp / "copies" / entry):
                for f in (f for f in files if not f.endswith(SUMS_SUFFIX)):
                    out.setdefault(entry[: -len(".placed")], []).append(Path(base, f).read_bytes())
    return out


def allocated(root: str) -> int:
    return sum(
        os.stat(os.path.join(b, f)).st_blocks * 512 for b, _, fs in os.walk(root) for f in fs
    )


def test_each_writer_keeps_its_shard(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 5)
    h = placed(tmp_path)
    fs = fs_of(h)
    writers = workers()[:4]
    shards = {name: os.urandom(SHARD) for name in writers}
    fs.create_dir(f"{h.root}/ckpt")
    done = [write.options(**on(n)).remote(fs, f"{h.root}/ckpt/{n}", shards[n]) for n in writers]
    wrote = dict(zip(writers, ray.get(done), strict=True))
    ids = node_ids()
    assert all(wrote[n] == ids[n] for n in writers)
    # The storage node's own directory: a stub per shard, none of its bytes.
    assert allocated(h.root) < SHARD // 2
    for n in writers:
        assert Path(h.root, "ckpt", n).read_bytes() != shards[n]
    # Each writer's node holds its own shard; all holders together hold 2 of each.
    held = blobs(tmp_path)
    for n in writers:
        assert shards[n] in held.get(ids[n], []), n
    everything = [b for bs in held.values() for b in bs]
    assert sorted(everything) == sorted([*shards.values(), *shards.values()])
    assert sum(map(len, everything)) == 2 * 4 * SHARD
    # Listings and infos answer the file's size; every reader reads the shard.
    listed = fs.get_file_info(pafs.FileSelector(f"{h.root}/ckpt"))
    assert {i.base_name: i.size for i in listed} == {n: SHARD for n in writers}
    for n in writers:
        assert read(fs, f"{h.root}/ckpt/{n}") == shards[n]
    # A delete takes the holders' bytes with it.
    fs.delete_dir(f"{h.root}/ckpt")
    assert sum(map(len, blobs(tmp_path).values())) == 0


def test_small_files_stay_with_the_storage(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path)
    fs = fs_of(h)
    ray.get(write.options(**on(workers()[0])).remote(fs, f"{h.root}/state.json", b"{}"))
    assert Path(h.root, "state.json").read_bytes() == b"{}"
    assert blobs(tmp_path) == {}
    with pytest.raises(OSError, match=r"appending is not supported.*placement='writer'"):
        fs.open_append_stream(f"{h.root}/state.json")
    # A large file dropped unclosed is not published, and its holders keep nothing.
    out = fs.open_output_stream(f"{h.root}/dropped")
    out.write(os.urandom(2 * MiB))
    del out
    gc.collect()
    eventually(lambda: blobs(tmp_path) == {}, "the dropped write's staging files removed")
    assert fs.get_file_info(f"{h.root}/dropped").type == pafs.FileType.NotFound


def test_holder_lost_mid_write_publishes_nothing(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 4)
    w = workers()
    h = placed(tmp_path, w[0], named=(w[1],))
    fs = fs_of(h)
    old, new = os.urandom(SHARD), os.urandom(SHARD)
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(old)
    here = ray.get_runtime_context().get_node_id()
    [other] = [n for n in blobs(tmp_path) if n != here]  # the driver's file's other holder
    lost = pytest.raises(ConnectionError, match=r"placement='writer'.*lost mid-write")
    with lost, fs.open_output_stream(f"{h.root}/f") as out:
        out.write(new[: 2 * MiB])
        remove(replica_cluster, other)
        out.write(new[2 * MiB :])
    assert read(fs, f"{h.root}/f") == old  # the earlier version, read on this node
    assert all(new not in bs for bs in blobs(tmp_path).values())


def test_holder_lost_after_the_write_is_read_around(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    w = workers()
    h = placed(tmp_path, "head", named=(w[0],))
    fs = fs_of(h)
    data = os.urandom(SHARD)
    writer = ray.get(write.options(**on(w[1])).remote(fs, f"{h.root}/f", data))
    assert data in blobs(tmp_path)[writer]
    assert os.path.isdir(placed_root(h.replica_root, writer))
    remove(replica_cluster, writer)
    assert read(fs, f"{h.root}/f") == data
    assert fs.get_file_info(f"{h.root}/f").size == SHARD


def test_holder_lost_mid_read_hands_over_to_another(
    replica_cluster: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    top_up(replica_cluster, 4)
    ids, here = node_ids(), ray.get_runtime_context().get_node_id()
    live = sorted(ids.values())
    # A writer whose file this node does not hold: the read crosses the network.
    writer = next(n for n in workers() if here not in choose_holders(ids[n], live, 2, {}))
    h = placed(tmp_path, "head", named=(next(n for n in workers() if n != writer),))
    fs = fs_of(h)
    data = os.urandom(12 * MiB + 7)  # 7 read chunks of 2 MiB: more than a window ahead
    ray.get(write.options(**on(writer)).remote(fs, f"{h.root}/f", data))
    record = h.record_of(f"{h.root}/f")
    assert record is not None
    turn = zlib.crc32(f"{here}:{record.blob}".encode()) % 2
    first = sorted(record.holders)[turn][0]  # the holder this node reads first
    with caplog.at_level(logging.WARNING), fs.open_input_stream(f"{h.root}/f") as stream:
        head = stream.read(2 * MiB)
        remove(replica_cluster, first)
        rest = stream.read()
    assert head + rest == data
    assert f"on node {first[:12]} failed mid-read" in caplog.text


def test_racing_writers_leave_one_whole_version(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 4)
    w = workers()
    h = placed(tmp_path, "head", named=(w[0],))
    fs = fs_of(h)
    versions = [os.urandom(SHARD), os.urandom(SHARD)]
    racing = zip(w[1:3], versions, strict=True)
    ray.get([write.options(**on(n)).remote(fs, f"{h.root}/f", v) for n, v in racing])
    got = read(fs, f"{h.root}/f")
    assert got in versions
    # Both copies of the storage name the same version: their stubs are equal.
    ids = node_ids()
    stubs = {Path(h.root, "f").read_bytes(), (tmp_path / "copies" / ids[w[0]] / "f").read_bytes()}
    assert len(stubs) == 1
    record = h.record_of(f"{h.root}/f")
    assert record is not None
    for holder in record.holders:  # every holder of the winner holds it whole
        assert Path(record.where(holder)).read_bytes() == got
