"""``placement="writer"`` with ``incremental=True``: a holder reuses the chunks of
the blobs it already holds. A second save of a mostly unchanged file sends each
holder only the chunks it lacks (its agent's ``incremental_counters``: what it
fetched, what it copied from its own disk), and every holder's blob is the written
bytes; a damaged chunk of a held blob is never copied (it is sent); the file a
save reuses deleted mid-write leaves the new one whole; racing writers leave one
whole version and no other blob; a Ray Train run's reports (each rank's shard
written from its worker through the filesystem) reuse their earlier shards."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import pytest
import ray
import ray.train
from ray.cluster_utils import Cluster
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import StorageConfig, node_agent, storage_filesystem
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.placed_record import PlacedRecord
from tests.cluster.replicas.test_writer_placement import blobs, write
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.node_storage import CONFIG, read
from tests.support.replicas import top_up, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

CHUNK = CONFIG.chunk_bytes  # 1 MiB: the chunks a holder is offered
CHUNKS = 8
TAIL = 5  # under a quarter chunk: sent with the commit, never offered
SIZE = CHUNKS * CHUNK + TAIL


def incremental(tmp: Path, copy: str) -> WriterPlacedHandler:
    """Writer-placed incremental node storage on the head node, its copy on ``copy``."""
    ids = node_ids()
    fs = storage_filesystem(
        node=ids["head"],
        config=CONFIG,
        root=str(tmp / "copies" / ids["head"]),
        storage=StorageConfig(
            replicas=2,
            replica_nodes=(ids[copy],),
            replica_root=str(tmp / "copies" / "{node_id}"),
            placement="writer",
            incremental=True,
        ),
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, WriterPlacedHandler)
    return handler


def counters(node: str) -> dict[str, int]:
    """The incremental counters of node ``node``'s agent (a node id)."""
    found: dict[str, int] = ray.get(node_agent(node).incremental_counters.remote())
    return found


def delta(node: str, before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in counters(node).items()}


def changed(data: bytes, *chunks: int) -> bytes:
    """``data`` with each of ``chunks`` (whole chunks) new."""
    out = bytearray(data)
    for k in chunks:
        out[k * CHUNK : (k + 1) * CHUNK] = os.urandom(CHUNK)
    return bytes(out)


def saved(h: WriterPlacedHandler, path: str, data: bytes, writer: str) -> PlacedRecord:
    """``data`` written at ``path`` from node ``writer``; every holder's blob checked
    byte for byte, and the file read back."""
    fs = pafs.PyFileSystem(h)
    ray.get(write.options(**on(writer)).remote(fs, path, data))
    record = h.record_of(path)
    assert record is not None
    for holder in record.holders:
        assert Path(record.where(holder)).read_bytes() == data, holder[0][:12]
    assert read(fs, path) == data
    return record


def remote_holder(record: PlacedRecord, writer: str) -> str:
    [other] = [n for n, _ in record.holders if n != writer]
    return other


def test_a_second_save_sends_only_the_changed_chunks(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    w, ids = workers(), node_ids()
    h = incremental(tmp_path, w[0])
    pafs.PyFileSystem(h).create_dir(f"{h.root}/c1")
    pafs.PyFileSystem(h).create_dir(f"{h.root}/c2")
    first = os.urandom(SIZE)
    before = {n: counters(n) for n in ids.values()}
    record = saved(h, f"{h.root}/c1/shard", first, w[1])
    other = remote_holder(record, ids[w[1]])
    sent_first = delta(other, before[other])
    assert sent_first["bytes_sent"] == SIZE and sent_first["bytes_reused"] == 0
    # Two chunks of eight changed: the other holder is sent those and the tail.
    second = changed(first, 2, 5)
    before_other, before_writer = counters(other), counters(ids[w[1]])
    again = saved(h, f"{h.root}/c2/shard", second, w[1])
    assert again.holders == record.holders and again.blob != record.blob
    sent = delta(other, before_other)
    assert sent["bytes_sent"] == 2 * CHUNK + TAIL, sent
    assert sent["bytes_reused"] == (CHUNKS - 2) * CHUNK and sent["chunks_rejected"] == 0
    assert delta(ids[w[1]], before_writer)["bytes_reused"] == (CHUNKS - 2) * CHUNK
    assert read(pafs.PyFileSystem(h), f"{h.root}/c1/shard") == first  # untouched
    # Saved unchanged: each holder links the blob it holds (one copy on disk).
    before_other = counters(other)
    third = saved(h, f"{h.root}/c3", second, w[1])
    linked = delta(other, before_other)
    assert linked["files_linked"] == 1 and linked["bytes_sent"] == TAIL
    for holder in third.holders:
        assert os.stat(third.where(holder)).st_ino == os.stat(again.where(holder)).st_ino
    pafs.PyFileSystem(h).delete_file(f"{h.root}/c2/shard")
    assert read(pafs.PyFileSystem(h), f"{h.root}/c3") == second


def test_a_damaged_held_chunk_is_sent_not_reused(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 4)
    w, ids = workers(), node_ids()
    h = incremental(tmp_path, w[0])
    first = os.urandom(SIZE)
    record = saved(h, f"{h.root}/old", first, w[1])
    other = remote_holder(record, ids[w[1]])
    held = next(x for x in record.holders if x[0] == other)
    with open(record.where(held), "r+b") as blob:
        blob.seek(3 * CHUNK + 7)  # a byte of chunk 3 flipped on the other holder's disk
        byte = blob.read(1)
        blob.seek(3 * CHUNK + 7)
        blob.write(bytes([byte[0] ^ 0x01]))
    second = changed(first, 6)
    before = counters(other)
    saved(h, f"{h.root}/new", second, w[1])  # every holder's blob is the written bytes
    sent = delta(other, before)
    assert sent["chunks_rejected"] == 1, sent
    assert sent["bytes_sent"] == 2 * CHUNK + TAIL  # the damaged chunk, the changed one
    assert sent["bytes_reused"] == (CHUNKS - 2) * CHUNK


def test_the_reused_file_deleted_mid_write_leaves_the_new_one_whole(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    w, here = workers(), ray.get_runtime_context().get_node_id()
    h = incremental(tmp_path, w[0])
    fs = pafs.PyFileSystem(h)
    first = os.urandom(SIZE)
    with fs.open_output_stream(f"{h.root}/old") as out:
        out.write(first)
    record = h.record_of(f"{h.root}/old")
    assert record is not None
    other = remote_holder(record, here)
    second, half = changed(first, 1), CHUNKS // 2 * CHUNK
    before = counters(other)
    with fs.open_output_stream(f"{h.root}/new") as out:
        out.write(second[:half])
        fs.delete_file(f"{h.root}/old")  # checkpoint rotation: its blobs go now
        assert all(first not in held for held in blobs(tmp_path).values())
        out.write(second[half:])
    new = h.record_of(f"{h.root}/new")
    assert new is not None
    for holder in new.holders:
        assert Path(new.where(holder)).read_bytes() == second
    assert read(fs, f"{h.root}/new") == second
    sent = delta(other, before)
    assert sent["bytes_sent"] >= SIZE - half  # written after the delete: nothing to reuse
    assert sent["bytes_sent"] + sent["bytes_reused"] == SIZE


def test_racing_incremental_writers_leave_one_whole_version(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    w = workers()
    h = incremental(tmp_path, w[0])
    fs = pafs.PyFileSystem(h)
    first = os.urandom(SIZE)
    saved(h, f"{h.root}/f", first, w[1])
    versions = [changed(first, 0), changed(first, 7)]  # each reusing most of the first
    racing = zip(w[1:3], versions, strict=True)
    ray.get([write.options(**on(n)).remote(fs, f"{h.root}/f", v) for n, v in racing])
    got = read(fs, f"{h.root}/f")
    assert got in versions
    record = h.record_of(f"{h.root}/f")
    assert record is not None
    for holder in record.holders:
        assert Path(record.where(holder)).read_bytes() == got
    # The first version's blobs and the race's loser's went: only the winner's stay.
    assert sorted(b for held in blobs(tmp_path).values() for b in held) == [got, got]


def test_appends_stay_refused_with_incremental(replica_cluster: Cluster, tmp_path: Path) -> None:
    top_up(replica_cluster, 4)
    h = incremental(tmp_path, workers()[0])
    fs = pafs.PyFileSystem(h)
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(os.urandom(2 * MiB))
    with pytest.raises(OSError, match=r"appending is not supported.*placement='writer'"):
        fs.open_append_stream(f"{h.root}/f")


STEPS = 3


def loop(config: dict[str, Any]) -> None:
    """Each step every rank reports its shard: the same bytes every step but for
    the first chunk; the sha256 of each noted once its report returned."""
    rank = ray.train.get_context().get_world_rank()
    base = np.random.default_rng(rank).bytes(SIZE)
    for step in range(STEPS):
        d = Path(tempfile.mkdtemp(prefix=f"step{step}-{rank}-"))
        shard = os.urandom(CHUNK) + base[CHUNK:]
        (d / f"shard-{rank}.bin").write_bytes(shard)
        ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(str(d)))
        (Path(config["out"]) / f"{step}-{rank}").write_text(hashlib.sha256(shard).hexdigest())


def test_a_train_run_sends_each_holder_only_the_changed_chunk(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h, ids = incremental(tmp_path, workers()[0]), node_ids()
    out = tmp_path / "out"
    out.mkdir()
    before = {n: counters(n) for n in ids.values()}
    result = DataParallelTrainer(
        loop,
        train_loop_config={"out": str(out)},
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(
            name="run",
            storage_path=f"{h.root}/runs",
            storage_filesystem=pafs.PyFileSystem(h),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    ).fit()
    moved = [delta(n, before[n]) for n in ids.values()]
    # Two ranks, two holders each: the first step sent whole, each later one the
    # changed chunk and the tail, the rest copied by each holder from its disk.
    later = 2 * 2 * (STEPS - 1)
    assert sum(m["bytes_sent"] for m in moved) == 2 * 2 * SIZE + later * (CHUNK + TAIL)
    assert sum(m["bytes_reused"] for m in moved) == later * (CHUNKS - 1) * CHUNK
    assert sum(m["chunks_rejected"] for m in moved) == 0
    assert result.checkpoint is not None
    fs = pafs.PyFileSystem(h)
    for rank in (0, 1):
        path = f"{result.checkpoint.path}/shard-{rank}.bin"
        record = h.record_of(path)
        assert record is not None
        wrote = (out / f"{STEPS - 1}-{rank}").read_text()
        for holder in record.holders:
            assert hashlib.sha256(Path(record.where(holder)).read_bytes()).hexdigest() == wrote
        assert hashlib.sha256(read(fs, path)).hexdigest() == wrote
