"""A holder's part in the durable drain of a writer-placed storage, without Ray: its
blob sent whole to the tier when every chunk matches what its writer recorded,
nothing committed there when one does not or the blob is short, a checksum list
handed over only from under the placed root and only up to its bound; and the
settings that make a writer-placed storage's drain know where its bytes live."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from air_transfer import StorageConfig
from air_transfer.errors import ChecksumError
from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.node_wire import PlacedSend
from air_transfer.storage.placed_record import ChunkSummer, PlacedRecord
from air_transfer.storage.server.drain import holder_sends
from air_transfer.storage.server.drain.holder_sends import HolderSends
from air_transfer.train.settings import storage_settings

CHUNK = 64 * 1024
NODE = "ab" * 28
BLOB = f"{'0' * 24}/{'1' * 32}"


def blob_of(tmp: Path, data: bytes) -> tuple[str, PlacedSend]:
    """A holder's placed root under ``tmp`` holding ``data`` as a blob, and the send
    of it (its writer's checksums as the tier record)."""
    root = tmp / f"{NODE}.placed"
    (root / BLOB).parent.mkdir(parents=True)
    (root / BLOB).write_bytes(data)
    summer = ChunkSummer(CHUNK)
    summer.update(data)
    sums = summer.finish()
    placed = PlacedRecord(len(data), BLOB, ((NODE, str(root)),), "0" * 64)
    record = FileRecord(len(data), 0, 0o644, CHUNK, sums.sums)
    return str(root), PlacedSend("ckpt/shard", placed, record)


def tier(tmp: Path) -> DurableTarget:
    (tmp / "tier").mkdir()
    return DurableTarget.parse((pafs.LocalFileSystem(), str(tmp / "tier")))


def test_a_good_blob_is_sent_whole_and_counted(tmp_path: Path) -> None:
    data = os.urandom(3 * CHUNK + 5)
    root, send = blob_of(tmp_path, data)
    sends = HolderSends()
    made = sends.placed_send(root, send, tier(tmp_path), DrainSettings())
    assert (tmp_path / "tier" / "ckpt" / "shard").read_bytes() == data
    assert made.sums == send.record.sums and made.tag
    assert sends.bytes_sent == len(data)


@pytest.mark.parametrize("at", [0, CHUNK + 7, 3 * CHUNK + 4])
def test_a_damaged_chunk_sends_nothing(tmp_path: Path, at: int) -> None:
    data = os.urandom(3 * CHUNK + 5)
    root, send = blob_of(tmp_path, data)
    damaged = bytearray(data)
    damaged[at] ^= 1
    Path(root, BLOB).write_bytes(bytes(damaged))
    sends = HolderSends()
    with pytest.raises(ChecksumError, match=f"chunk {at // CHUNK} of the blob does not match"):
        sends.placed_send(root, send, tier(tmp_path), DrainSettings())
    assert not (tmp_path / "tier" / "ckpt" / "shard").exists()
    assert sends.bytes_sent == 0


def test_a_short_blob_sends_nothing(tmp_path: Path) -> None:
    data = os.urandom(2 * CHUNK)
    root, send = blob_of(tmp_path, data)
    Path(root, BLOB).write_bytes(data[:-1])
    with pytest.raises(ChecksumError, match=f"holds {2 * CHUNK - 1} bytes, its record"):
        HolderSends().placed_send(root, send, tier(tmp_path), DrainSettings())
    assert not (tmp_path / "tier" / "ckpt" / "shard").exists()


def test_a_checksum_list_only_from_under_the_root_and_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = blob_of(tmp_path, b"x" * 10)
    Path(root, BLOB + ".sums").write_bytes(b"list")
    sends = HolderSends()
    assert sends.placed_sums_bytes(root, f"{root}/{BLOB}.sums") == b"list"
    (tmp_path / "outside").write_bytes(b"secret")
    with pytest.raises(OSError):
        sends.placed_sums_bytes(root, f"{root}/../outside")
    monkeypatch.setattr(holder_sends, "MAX_SUMS_BYTES", 3)
    with pytest.raises(ValueError, match="holds 4 bytes, more than a placed file's can"):
        sends.placed_sums_bytes(root, f"{root}/{BLOB}.sums")


def test_a_writer_placed_storage_drains_knowing_where_its_bytes_live() -> None:
    copies = "/tmp/copies/{node_id}"
    placed = StorageConfig(replicas=2, replica_root=copies, placement="writer", durable="/t")
    plain = StorageConfig(replicas=2, replica_root=copies, durable="/t")
    settings = [
        storage_settings("ab" * 28, None, "/tmp/r", StorageConfig(), s) for s in (placed, plain)
    ]
    assert [s.drain.placed_root if s.drain else "" for s in settings] == [copies, None]
