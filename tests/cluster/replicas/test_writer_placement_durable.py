"""Writer-placed node storage with a durable tier (moto's S3 server over HTTP): each
placed file's bytes go to the tier from a node that holds them, the writer's first,
never through the storage node; a holder lost or whose bytes do not match is passed
over; with no good holder the file never reaches the tier and no manifest names it;
a file replaced while its bytes are sent is taken as it is then; and what only the
tier holds is read back, verified, through the same storage."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
from ray.cluster_utils import Cluster

import air_transfer
from air_transfer import StorageConfig
from air_transfer.cluster.nodes import node_agent
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.placed_record import PlacedRecord
from tests.cluster.replicas.test_replica_durable import _bucket
from tests.cluster.replicas.test_writer_placement import SHARD, placed, write
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.node_storage import CONFIG, read
from tests.support.replicas import fresh_roots, remove, top_up, workers
from tests.support.s3 import S3Server, bucket_server
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "tier")


def drained(s3: S3Server, tmp: Path, **settings: Any) -> WriterPlacedHandler:
    """Writer-placed node storage on the head node, drained into ``tier/<tmp's
    name>`` (a prefix of each test's own, whichever run of it)."""
    prefix = tmp.name
    head = node_ids()["head"]
    storage = StorageConfig(
        replicas=2,
        replica_root=str(tmp / "copies" / "{node_id}"),
        placement="writer",
        durable=(s3.filesystem(attempts=1), f"tier/{prefix}"),
        **settings,
    )
    fs = air_transfer.storage_filesystem(
        node=head, config=CONFIG, root=str(tmp / "copies" / head), storage=storage
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, WriterPlacedHandler)
    return handler


def sent() -> dict[str, int]:
    """Bytes of placed files each live node's agent sent to a durable tier."""
    return {
        node: ray.get(node_agent(node).read_counters.remote())["placed_bytes_sent"]
        for node in node_ids().values()
    }


def shards_by(h: WriterPlacedHandler, writers: list[str]) -> dict[str, bytes]:
    """One placed shard per writer node, each written there, and a small file."""
    fs = pafs.PyFileSystem(h)
    fs.create_dir(f"{h.root}/ckpt")
    shards = {f"ckpt/{n}": os.urandom(SHARD + i) for i, n in enumerate(writers)}
    ray.get(
        [
            write.options(**on(n)).remote(fs, f"{h.root}/ckpt/{n}", shards[f"ckpt/{n}"])
            for n in writers
        ]
    )
    ray.get(write.options(**on(writers[0])).remote(fs, f"{h.root}/ckpt/state.json", b"{}"))
    return {**shards, "ckpt/state.json": b"{}"}


def uploading(s3: S3Server, key: str) -> bool:
    """Whether a multipart upload of ``key`` is in flight in the bucket."""
    client: Any = s3.client()
    found = client.list_multipart_uploads(Bucket="tier").get("Uploads", [])
    return any(u["Key"] == key for u in found)


def sent_slowly(s3: S3Server, tmp: Path) -> tuple[WriterPlacedHandler, bytes]:
    """A storage whose drain sends at 2 MiB/s, and the 12 MiB file ``ckpt/big`` its
    first worker wrote, once its holder's upload to the tier is under way."""
    h = drained(s3, tmp, durable_bytes_per_s=2 * MiB, durable_part_bytes=5 * MiB)
    fs = pafs.PyFileSystem(h)
    fs.create_dir(f"{h.root}/ckpt")
    data = os.urandom(12 * MiB)
    ray.get(write.options(**on(workers()[0])).remote(fs, f"{h.root}/ckpt/big", data))
    eventually(lambda: uploading(s3, f"{tmp.name}/ckpt/big"), "the holder's upload to start", 60)
    return h, data


def damage(record: PlacedRecord, holder: int) -> None:
    """Flip one byte of the blob on ``record``'s holder ``holder``."""
    where = record.where(record.holders[holder])
    with open(where, "r+b") as f:
        f.seek(SHARD // 2)
        byte = f.read(1)
        f.seek(SHARD // 2)
        f.write(bytes([byte[0] ^ 1]))


def test_each_writer_node_sends_its_own_bytes_and_the_tier_reads_back(
    replica_cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h = drained(s3, tmp_path)
    writers, ids = workers()[:3], node_ids()
    before = sent()
    files = shards_by(h, writers)
    air_transfer.wait_durable(pafs.PyFileSystem(h), timeout=120)
    assert _bucket(s3, tmp_path.name) == files  # bit-identical, the stubs' records nowhere
    after = sent()
    for i, n in enumerate(writers):  # the writer's node sent its shard, once
        assert after[ids[n]] - before[ids[n]] == SHARD + i, n
    assert after[ids["head"]] == before[ids["head"]]  # the storage node sent none of them
    # As on a new cluster: only the tier holds the checkpoint; read back, verified.
    for root in fresh_roots(h).values():
        for name in files:
            os.unlink(os.path.join(root, name))
    fs = pafs.PyFileSystem(h)
    for name, data in files.items():
        assert read(fs, f"{h.root}/{name}") == data, name


def test_a_holder_lost_or_damaged_is_passed_over(
    replica_cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    undrained = placed(tmp_path)  # the same storage, its drain attached below
    writers = workers()[:3]
    files = shards_by(undrained, writers)
    records = [undrained.record_of(f"{undrained.root}/ckpt/{n}") for n in writers]
    assert all(r is not None for r in records)
    damaged = records[0]
    assert damaged is not None
    # A file whose writer's node holds no copy of the damaged one (2 of 3 do not).
    lost = next(r for r in records[1:] if r and r.holders[0][0] not in dict(damaged.holders))
    damage(damaged, 0)  # the writer's own copy: the other holder's is sent
    remove(replica_cluster, lost.holders[0][0])  # the writer's node, gone
    before = sent()
    h = drained(s3, tmp_path)
    air_transfer.wait_durable(pafs.PyFileSystem(h), timeout=120)
    assert _bucket(s3, tmp_path.name) == files
    expected = {node: 0 for node in node_ids().values()}
    expected[damaged.holders[1][0]] += damaged.size
    expected[lost.holders[1][0]] += lost.size
    for record in records[1:]:  # the third file: its writer's node sent it
        if record is not lost and record is not None:
            expected[record.holders[0][0]] += record.size
    after = sent()
    assert {node: after[node] - before[node] for node in expected} == expected


def test_with_no_good_holder_the_file_never_reaches_the_tier(
    replica_cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    undrained = placed(tmp_path)
    [writer] = workers()[:1]
    files = shards_by(undrained, [writer])
    record = undrained.record_of(f"{undrained.root}/ckpt/{writer}")
    assert record is not None
    damage(record, 0)
    damage(record, 1)
    h = drained(s3, tmp_path)
    fs = pafs.PyFileSystem(h)

    def refused() -> str | None:
        """What a short ``wait_durable`` says once a pass found no good holder (one
        cut short before that says only what is missing)."""
        with pytest.raises(TimeoutError) as waited:
            air_transfer.wait_durable(fs, timeout=1)
        said = str(waited.value)
        return said if re.search(f"ckpt/{writer}.*no holder", said) else None

    eventually(refused, "wait_durable naming the file that no holder could send", 60)
    assert f"ckpt/{writer}" not in _bucket(s3, tmp_path.name)
    assert air_transfer.storage_state(fs, f"{h.root}/ckpt").durable is False
    # Written again, it drains.
    with fs.open_output_stream(f"{h.root}/ckpt/{writer}") as out:
        out.write(files[f"ckpt/{writer}"])
    air_transfer.wait_durable(fs, timeout=120)
    assert _bucket(s3, tmp_path.name) == files


def test_a_file_replaced_while_its_bytes_are_sent_drains_as_it_is_then(
    replica_cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h, _ = sent_slowly(s3, tmp_path)
    fs, path = pafs.PyFileSystem(h), f"{h.root}/ckpt/big"
    second = os.urandom(12 * MiB + 1)
    ray.get(write.options(**on(workers()[1])).remote(fs, path, second))  # its blob deleted
    air_transfer.wait_durable(fs, timeout=120)
    assert _bucket(s3, tmp_path.name) == {"ckpt/big": second}
    assert read(fs, path) == second


def test_a_holder_lost_mid_send_is_passed_over(
    replica_cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h, data = sent_slowly(s3, tmp_path)
    fs = pafs.PyFileSystem(h)
    record = h.record_of(f"{h.root}/ckpt/big")
    assert record is not None and record.holders[0][0] == node_ids()[workers()[0]]
    remove(replica_cluster, record.holders[0][0])  # mid-send: its peer sends instead
    air_transfer.wait_durable(fs, timeout=120)
    assert _bucket(s3, tmp_path.name) == {"ckpt/big": data}
    assert not uploading(s3, f"{tmp_path.name}/ckpt/big")  # the lost node's upload: aborted
