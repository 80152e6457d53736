"""``placement="writer"``: a holder's bytes are checked against what their writer
recorded on every read, check and repair. A holder whose blob was damaged on disk
(a flipped byte, cut short) or whose checksums were forged is read around, mid-read
too, never returned; ``air-transfer verify`` names it; ``repair_holders`` copies
from a good holder only and replaces the damaged one; with every holder damaged a
read is an error naming the file, with nothing wrong returned."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zlib
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer.cli.main import main
from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.placed_record import PlacedRecord, choose_holders
from tests.cluster.replicas.test_writer_placement import SHARD, fs_of, placed, write
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.replicas import top_up, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

CHUNK = 2 * MiB  # the read chunk of the tests' CONFIG: SHARD is 2 chunks
NOT_MATCHING = r"no holder of '.*d/f' has bytes that match its record"


def flip(blob: str, at: int = CHUNK + 100) -> None:
    """One byte of ``blob`` changed on disk, in its second chunk."""
    with open(blob, "r+b") as f:
        f.seek(at)
        byte = f.read(1)
        f.seek(at)
        f.write(bytes([byte[0] ^ 0x40]))


def stored(h: WriterPlacedHandler, tmp: Path, writer: str = "") -> tuple[str, bytes, PlacedRecord]:
    """A placed file at ``d/f`` written on node ``writer`` (else by this driver)."""
    fs, data, path = fs_of(h), os.urandom(SHARD), f"{h.root}/d/f"
    fs.create_dir(f"{h.root}/d")
    if writer:
        ray.get(write.options(**on(writer)).remote(fs, path, data))
    else:
        with fs.open_output_stream(path) as out:
            out.write(data)
    record = h.record_of(path)
    assert record is not None
    assert all(Path(record.where(x)).read_bytes() == data for x in record.holders)
    return path, data, record


def far_writer() -> str:
    """A worker whose file this driver's node does not hold (read through agents)."""
    ids, here = node_ids(), ray.get_runtime_context().get_node_id()
    live = sorted(ids.values())
    return next(n for n in workers() if here not in choose_holders(ids[n], live, 2, {}))


def first_read(record: PlacedRecord) -> tuple[str, str]:
    """The holder a read on this node tries first: its own, else one drawn from its id."""
    here = ray.get_runtime_context().get_node_id()
    if here in dict(record.holders):
        return (here, dict(record.holders)[here])
    turn = zlib.crc32(f"{here}:{record.blob}".encode()) % len(record.holders)
    return sorted(record.holders)[turn]


def verified(h: WriterPlacedHandler, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify", h.root, "d"])
    return code, capsys.readouterr().out


@pytest.mark.parametrize("where", ["this node's disk", "another node's agent"])
def test_a_damaged_holder_is_read_around_named_and_repaired(
    replica_cluster: Cluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
    where: str,
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    writer = far_writer() if where == "another node's agent" else ""
    path, data, record = stored(h, tmp_path, writer)
    damaged = first_read(record)
    here = ray.get_runtime_context().get_node_id()
    assert (damaged[0] == here) == (where == "this node's disk")
    flip(record.where(damaged))
    with caplog.at_level(logging.WARNING):
        got = read(fs_of(h), path)  # its first chunk from the damaged holder, then not
    assert got == data
    assert f"of {path} on node {damaged[0][:12]} holds bytes that do not match" in caplog.text
    code, out = verified(h, capsys)
    assert code == 1, out
    assert f"the holder on node {damaged[0][:12]} does not match the record" in out
    assert h.repair_holders(h.root) == [path]
    after = h.record_of(path)
    assert after is not None and len(after.holders) == 2
    for holder in after.holders:  # K good copies again, every byte
        assert Path(after.where(holder)).read_bytes() == data
    assert verified(h, capsys)[0] == 0
    assert read(fs_of(h), path) == data
    assert h.repair_holders(h.root) == []


def test_every_holder_damaged_is_an_error_naming_the_file(
    replica_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    path, _, record = stored(h, tmp_path, far_writer())
    for holder in record.holders:
        flip(record.where(holder), at=10)  # in the first chunk: nothing good to hand out
    with pytest.raises(OSError, match=NOT_MATCHING) as error, fs_of(h).open_input_stream(path) as f:
        f.read()
    for node, _ in record.holders:
        assert node[:12] in str(error.value)
    code, out = verified(h, capsys)
    assert code == 1 and out.count("does not match the record") == 2, out
    with pytest.raises(OSError, match=r"no live holder of '.*d/f' has bytes that match"):
        h.repair_holders(h.root)
    assert h.record_of(path) == record  # nothing copied from a damaged holder


def forge(record: PlacedRecord, holder: tuple[str, str], data: bytes) -> None:
    """``holder``'s blob replaced by ``data`` and its checksums by ones that match it:
    consistent, but not what the record pins."""
    sums_path = Path(record.sums_where(holder))
    magic, _, line = sums_path.read_bytes().partition(b"\n")
    body = json.loads(line)
    cb = body["chunk_bytes"]
    body["sums"] = [chunk_checksum(data[at : at + cb]) for at in range(0, len(data), cb)]
    sums_path.write_bytes(magic + b"\n" + json.dumps(body).encode() + b"\n")
    Path(record.where(holder)).write_bytes(data)


def test_forged_checksums_are_refused(
    replica_cluster: Cluster,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    path, data, record = stored(h, tmp_path, far_writer())
    other = os.urandom(SHARD)
    first = first_read(record)
    forge(record, first, other)
    assert hashlib.sha256(Path(record.sums_where(first)).read_bytes()).hexdigest() != record.sums
    with caplog.at_level(logging.WARNING):
        assert read(fs_of(h), path) == data  # the other holder's, pinned by the record
    assert f"checksums of placed file {path!r}" in caplog.text
    code, out = verified(h, capsys)
    assert code == 1 and f"the holder on node {first[0][:12]} does not match" in out, out
    for holder in record.holders:
        forge(record, holder, other)
    with pytest.raises(OSError, match=NOT_MATCHING), fs_of(h).open_input_stream(path) as f:
        f.read()


def test_a_truncated_blob_is_read_around_and_replaced(
    replica_cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    top_up(replica_cluster, 4)
    h = placed(tmp_path, "head", named=(workers()[0],))
    path, data, record = stored(h, tmp_path, far_writer())
    cut = first_read(record)
    os.truncate(record.where(cut), CHUNK + 10)  # a partial copy
    assert read(fs_of(h), path) == data
    code, out = verified(h, capsys)
    assert code == 1 and f"holds {CHUNK + 10} bytes, the record {SHARD}" in out, out
    assert h.repair_holders(h.root) == [path]
    after = h.record_of(path)
    assert after is not None
    assert [Path(after.where(x)).read_bytes() == data for x in after.holders] == [True, True]
