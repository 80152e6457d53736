"""What pins a writer-placed file's bytes: its writer's checksum of each chunk
(``ChunkSummer``, however the bytes were split into writes), kept beside the blob
and pinned by its sha256 in the record; a list read back is refused by name unless
it is byte for byte the one the record pins and describes the record's file."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.placed_record import (
    ChunkSummer,
    PlacedRecord,
    PlacedSums,
    decode,
    decode_sums,
    placed_root,
)

ROOT = "/tmp/copies/{node_id}"
N1 = "1" * 56
BLOB = "a" * 24 + "/" + "b" * 32
CB = 1000


def summed(data: bytes, pieces: list[int]) -> PlacedSums:
    summer, at = ChunkSummer(CB), 0
    for n in pieces:
        summer.update(memoryview(data)[at : at + n])
        at += n
    summer.update(data[at:])
    return summer.finish()


def record_of(sums: PlacedSums, digest: str | None = None) -> PlacedRecord:
    holders = ((N1, placed_root(ROOT, N1)),)
    return PlacedRecord(sums.size, BLOB, holders, digest or sums.digest())


@pytest.mark.parametrize("size", [1, CB - 1, CB, 3 * CB, 3 * CB + 7])
def test_each_chunks_checksum_however_the_writes_split_it(size: int) -> None:
    data = os.urandom(size)
    want = tuple(chunk_checksum(data[at : at + CB]) for at in range(0, size, CB))
    for pieces in ([], [1, 1, 1], [CB - 1, 2, CB + 5], [size]):
        sums = summed(data, pieces)
        assert (sums.size, sums.chunk_bytes, sums.sums) == (size, CB, want)


def test_the_record_pins_the_list_and_carries_it_through_the_stub() -> None:
    sums = summed(os.urandom(5 * CB + 3), [])
    record = record_of(sums)
    assert record.sums == hashlib.sha256(sums.encode()).hexdigest()
    assert decode(record.encode(), record.size, "/s/f", ROOT).sums == record.sums
    where = record.sums_where(record.holders[0])
    assert where == f"{placed_root(ROOT, N1)}/{BLOB}.sums"
    assert decode_sums(sums.encode(), record, "/s/f", where) == sums


def test_a_list_other_than_the_one_pinned_is_refused_by_name() -> None:
    data = os.urandom(5 * CB + 3)
    sums = summed(data, [])
    record = record_of(sums)
    good = sums.encode()
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 1
    other = summed(os.urandom(len(data)), [])  # another file's, of the same size
    refused = {
        "a byte flipped": bytes(flipped),
        "cut short": good[:-1],
        "another file's": other.encode(),
        "nothing": b"",
    }
    for what, data_read in refused.items():
        with pytest.raises(ValueError, match=r"checksums of placed file '/s/f' at '/h/x.sums'"):
            decode_sums(data_read, record, "/s/f", "/h/x.sums")
            pytest.fail(what)


def forged(body: dict[str, object]) -> bytes:
    """A list as a forger would write it (its sha256 then put in the record)."""
    magic = PlacedSums(0, 1, ()).encode().partition(b"\n")[0] + b"\n"
    return magic + json.dumps(body).encode() + b"\n"


def test_a_pinned_list_that_does_not_describe_the_file_is_refused() -> None:
    sums = summed(os.urandom(2 * CB + 1), [])
    body = {"size": sums.size, "chunk_bytes": CB, "sums": list(sums.sums)}
    malformed = {
        "too few sums": {**body, "sums": list(sums.sums[:-1])},
        "another size": {**body, "size": sums.size + 1},
        "no chunk size": {**body, "chunk_bytes": 0},
        "a sum not a checksum": {**body, "sums": ["x" * 32, *sums.sums[1:]]},
        "no sums": {"size": sums.size, "chunk_bytes": CB},
    }
    for what, forged_body in malformed.items():
        data = forged(forged_body)
        record = record_of(sums, hashlib.sha256(data).hexdigest())
        with pytest.raises(ValueError, match=r"do not match its record.*refused"):
            decode_sums(data, record, "/s/f", "/h/x.sums")
            pytest.fail(what)
