"""``StorageConfig(placement=...)``: "writer" refused, naming the setting, where it
is not built; a placed file's record read back only when whole and its own; the
holders of a file (its writer's node first, each node one copy when all write)."""

from __future__ import annotations

import pytest

from air_transfer import StorageConfig, storage_filesystem
from air_transfer.storage.placed_record import (
    PlacedRecord,
    choose_holders,
    decode,
    placed_root,
)

ROOT = "/tmp/copies/{node_id}"


def test_the_default_placement_is_the_storage_node() -> None:
    assert StorageConfig().placement == "storage"
    assert StorageConfig(replicas=2, replica_root=ROOT, placement="writer").placement == "writer"


def test_writer_placement_takes_incremental_saves() -> None:
    chosen = StorageConfig(replicas=2, replica_root=ROOT, placement="writer", incremental=True)
    assert chosen.incremental
    with pytest.raises(TypeError, match=r"StorageConfig.incremental must be a bool, got 'yes'"):
        StorageConfig(replicas=2, replica_root=ROOT, placement="writer", incremental="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"placement": "nearby"}, r"placement must be one of \('storage', 'writer'\)"),
        ({"replicas": 1}, r"placement='writer' needs replicas >= 2"),
        ({"replica_root": None}, r"placement='writer' needs a replica_root with '\{node_id\}'"),
        ({"replica_root": "/tmp/copies"}, r"needs a replica_root with '\{node_id\}'"),
    ],
)
def test_combinations_not_built_are_refused(settings: dict[str, object], named: str) -> None:
    given: dict[str, object] = {"replicas": 2, "replica_root": ROOT, "placement": "writer"}
    with pytest.raises(ValueError, match=named):
        StorageConfig(**{**given, **settings})  # type: ignore[arg-type]


def test_storage_filesystem_takes_placement_as_a_keyword_or_in_storage() -> None:
    with pytest.raises(ValueError, match=r"placement='writer' needs replicas >= 2"):
        storage_filesystem(root="/tmp/x", placement="writer")
    with pytest.raises(ValueError, match="placement and durable either as keywords"):
        storage_filesystem(
            root="/tmp/x",
            placement="writer",
            replicas=2,
            replica_root=ROOT,
            storage=StorageConfig(replicas=2, replica_root=ROOT, placement="writer"),
        )


N1, N2 = "1" * 56, "2" * 56
BLOB = "a" * 24 + "/" + "b" * 32
DIGEST = "c" * 64


def made(blob: str, holders: tuple[tuple[str, str], ...], digest: str = DIGEST) -> bytes:
    return PlacedRecord(5 << 20, blob, holders, digest).encode()


def test_a_record_reads_back_only_whole_of_its_size_and_naming_placed_blobs() -> None:
    roots = tuple((n, placed_root(ROOT, n)) for n in (N1, N2))
    record = PlacedRecord(5 << 20, BLOB, roots, DIGEST)
    head = record.encode()
    assert decode(head + b"\x00" * 100, 5 << 20, "/s/f", ROOT) == record
    forged = {
        "another size": (head, (5 << 20) + 1),
        "cut short": (head[:-1], 5 << 20),
        "no record": (b"x" + head, 5 << 20),
        "a blob leaving the placed root": (made("../etc", roots), 0),
        "a blob not of a write": (made("ab/cd", roots), 0),
        "a holder not a node id": (made(BLOB, (("n/..", "/r"),)), 0),
        "a holder elsewhere": (made(BLOB, ((N1, "/etc"),)), 0),
        "a holder twice": (made(BLOB, (roots[0], roots[0])), 0),
        "no holder": (made(BLOB, ()), 0),
        "no digest": (head.replace(f',"sums":"{DIGEST}"'.encode(), b""), 0),
        "a digest not a sha256": (made(BLOB, roots, "c" * 63), 0),
        "a digest in capitals": (made(BLOB, roots, "C" * 64), 0),
    }
    for what, (data, size) in forged.items():
        with pytest.raises(ValueError, match=r"record of '/s/f' .*placement='writer'.*refused"):
            decode(data, size or 5 << 20, "/s/f", ROOT)
            pytest.fail(what)
    with pytest.raises(ValueError, match="does not fit the stub"):
        PlacedRecord(100, BLOB, record.holders, DIGEST).encode()


def test_each_writer_holds_its_own_file_and_every_node_one_copy() -> None:
    live = ["d", "a", "c", "b"]
    holders = {w: choose_holders(w, live, 2, {}) for w in live}
    assert all(h[0] == w for w, h in holders.items())
    received = sorted(h[1] for h in holders.values())
    assert received == ["a", "b", "c", "d"]
    with pytest.raises(ValueError, match="needs 3 live nodes"):
        choose_holders("a", ["a", "b"], 3, {})
    assert placed_root(ROOT, "n1") == "/tmp/copies/n1.placed"


def test_a_failure_domain_that_is_no_label_key_is_refused() -> None:
    for wrong in ("", "  ", 3):
        with pytest.raises(ValueError, match=r"failure_domain must be a node label's key"):
            StorageConfig(failure_domain=wrong)  # type: ignore[arg-type]
    assert StorageConfig(failure_domain=None).failure_domain is None
