"""What the drain trusts, against a real S3 API over HTTP (moto's server, no Ray):
identical files copied inside the bucket only from a source the bucket confirms
unchanged, never from a corrupted or missing one (uploaded instead, the source sent
again); losses found by a confirming pass (an object or the whole bucket gone) sent
again; no plan retried unchanged (a drain that starts again over a record naming a
missing object does not wedge)."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.tombstones import MemoryTombstones
from air_transfer.storage.server.drain.journal import MemoryJournal
from air_transfer.storage.server.drain.loop import Drainer
from air_transfer.storage.server.drain.passes import Drain
from tests.support.drains import SMALL, assert_same, drained, draining
from tests.support.s3 import S3Server, bucket_server
from tests.support.trees import write_file

BUCKET = "trust"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), BUCKET)


def _target(s3: S3Server, prefix: str) -> DurableTarget:
    return DurableTarget.parse(s3.uri(BUCKET, prefix))


def _object(s3: S3Server, key: str, bucket: str = BUCKET) -> bytes:
    client: Any = s3.client()
    body: bytes = client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


def test_a_file_the_tier_holds_under_another_name_is_copied_there(
    s3: S3Server, tmp_path: Path
) -> None:
    root, target = tmp_path / "root", _target(s3, "copied")
    frozen = random.Random(6).randbytes(300_000)
    write_file(root / "ckpt_1" / "frozen.bin", frozen)
    with draining(root, target) as drainer:
        first = drained(drainer)
        write_file(root / "ckpt_2" / "frozen.bin", frozen)
        write_file(root / "ckpt_2" / "new.bin", b"x" * 1000)
        second = drained(drainer)
    assert second.uploaded_bytes - first.uploaded_bytes == 1000  # the new file alone
    assert second.copied_bytes - first.copied_bytes == len(frozen)
    assert_same(root, target)


def test_identical_files_new_in_one_pass_are_sent_once(s3: S3Server, tmp_path: Path) -> None:
    """Reports made faster than the tier takes them reach one pass together: their
    shared bytes still travel once (each file hashed first, one of each content sent,
    the others copied inside the tier)."""
    root, target = tmp_path / "root", _target(s3, "once")
    frozen = random.Random(9).randbytes(300_000)
    for report in range(3):
        write_file(root / f"ckpt_{report}" / "frozen.bin", frozen)
        write_file(root / f"ckpt_{report}" / "head.bin", bytes([report]) * 1000)
    with draining(root, target) as drainer:
        status = drained(drainer)
    assert status.uploaded_bytes == len(frozen) + 3 * 1000
    assert status.copied_bytes == 2 * len(frozen)
    assert_same(root, target)


def test_a_corrupted_object_is_never_the_source_of_a_copy(s3: S3Server, tmp_path: Path) -> None:
    """An object replaced in the bucket (one byte flipped, same size) no longer
    serves as a copy's source: the later file is sent, and the corrupted one sent
    again from node storage, which still holds it."""
    root, target = tmp_path / "root", _target(s3, "corrupt")
    frozen = random.Random(11).randbytes(200_000)
    write_file(root / "ckpt_1" / "model.bin", frozen)
    with draining(root, target) as drainer:
        drained(drainer)
        flipped = bytearray(frozen)
        flipped[1234] ^= 1
        client: Any = s3.client()
        client.put_object(Bucket=BUCKET, Key="corrupt/ckpt_1/model.bin", Body=bytes(flipped))
        write_file(root / "ckpt_2" / "model.bin", frozen)
        status = drained(drainer)
        assert status.copied_bytes == 0  # never copied from what the bucket holds now
        assert _object(s3, "corrupt/ckpt_2/model.bin") == frozen
        drained(drainer)  # the pass after: the lost source is sent again
    assert _object(s3, "corrupt/ckpt_1/model.bin") == frozen
    assert_same(root, target)


def test_a_copy_source_gone_from_the_bucket_falls_back_to_an_upload(
    s3: S3Server, tmp_path: Path
) -> None:
    """A source deleted behind the drain's back (a lifecycle rule, an operator):
    the copy is not tried again and again; the file is sent, the source too."""
    root, target = tmp_path / "root", _target(s3, "gone")
    frozen = random.Random(12).randbytes(100_000)
    write_file(root / "ckpt_1" / "model.bin", frozen)
    with draining(root, target) as drainer:
        drained(drainer)
        client: Any = s3.client()
        client.delete_object(Bucket=BUCKET, Key="gone/ckpt_1/model.bin")
        write_file(root / "ckpt_2" / "model.bin", frozen)
        status = drained(drainer)
        assert status.errors == 0 and status.last_error is None
        drained(drainer)
    assert_same(root, target)


def test_a_drain_that_starts_again_over_a_missing_object_does_not_wedge(
    s3: S3Server, tmp_path: Path
) -> None:
    """The manifest names an object the bucket lacks (an agent killed between a
    pass's deletes and its records, a lifecycle rule): a new drain (the agent
    started again) sends what is missing, and what came after reaches the tier."""
    root, target = tmp_path / "root", _target(s3, "wedge")
    frozen = random.Random(13).randbytes(150_000)
    write_file(root / "ckpt_1" / "model.bin", frozen)
    stones, journal = MemoryTombstones(), MemoryJournal()
    first = Drainer(Drain(str(root), target, SMALL, stones, threading.Lock(), journal)).start()
    try:
        drained(first)
    finally:
        first.stop()
    client: Any = s3.client()
    client.delete_object(Bucket=BUCKET, Key="wedge/ckpt_1/model.bin")
    write_file(root / "ckpt_2" / "model.bin", frozen)
    write_file(root / "run_state.json", b'{"latest": "ckpt_2"}')
    again = Drainer(Drain(str(root), target, SMALL, stones, threading.Lock(), journal)).start()
    try:
        status = drained(again)
        assert status.errors == 0, status.last_error
        drained(again)
    finally:
        again.stop()
    assert_same(root, target)


def test_a_confirming_pass_sends_again_what_the_bucket_lost(s3: S3Server, tmp_path: Path) -> None:
    """An object deleted from the bucket, then the bucket itself deleted and made
    again: a pass that confirms everything first (``wait_durable``'s, the scrub's)
    finds each loss and sends it again, manifests included, while node storage's
    file is unchanged."""
    bucket = "lost-bucket"
    s3.create_bucket(bucket)
    root, target = tmp_path / "root", DurableTarget.parse(s3.uri(bucket, "run"))
    write_file(root / "a" / "one.bin", random.Random(14).randbytes(70_000))
    write_file(root / "a" / "two.bin", random.Random(15).randbytes(80_000))
    with draining(root, target) as drainer:
        drained(drainer)
        client: Any = s3.client()
        client.delete_object(Bucket=bucket, Key="run/a/two.bin")
        assert drained(drainer).uploaded_bytes == 150_000  # a plain pass sees nothing
        _confirmed(drainer)
        assert _object(s3, "run/a/two.bin", bucket) == (root / "a" / "two.bin").read_bytes()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for obj in page.get("Contents", []):
                client.delete_object(Bucket=bucket, Key=obj["Key"])
        client.delete_bucket(Bucket=bucket)
        client.create_bucket(Bucket=bucket)
        _confirmed(drainer)
    assert_same(root, target)


def test_the_parts_of_an_upload_fit_s3s_part_limit_whatever_the_size(
    s3: S3Server, tmp_path: Path
) -> None:
    """S3 takes at most 10,000 parts (pyarrow's fixed 10 MiB parts stop at ~98 GiB):
    with the limit forced down to 3, a 24 MiB file goes in 3 parts of 8 MiB."""
    mib = 1024 * 1024
    root, target = tmp_path / "root", _target(s3, "parts")
    data = random.Random(16).randbytes(24 * mib)
    write_file(root / "big.bin", data)
    settings = DrainSettings(
        chunk_bytes=mib, part_bytes=5 * mib, max_parts=3, rescan_s=60.0, backoff_s=(0.05, 0.5)
    )
    with draining(root, target, settings) as drainer:
        drained(drainer)
    client: Any = s3.client()
    head = client.head_object(Bucket=BUCKET, Key="parts/big.bin", PartNumber=1)
    assert head["PartsCount"] == 3 and head["ContentLength"] == 8 * mib
    assert _object(s3, "parts/big.bin") == data


def test_a_delete_waits_while_a_newer_file_may_be_copied_from_what_it_deletes(
    s3: S3Server, tmp_path: Path
) -> None:
    """Reports faster than the tier, pruned by ``num_to_keep``: the next report (its
    frozen file the same bytes) lands while the tier takes the first, and the first
    is deleted meanwhile. The delete waits a pass, so the newer file is copied inside
    the tier from the first rather than sent again."""
    root, target = tmp_path / "root", _target(s3, "deferred")
    frozen = random.Random(10).randbytes(300_000)
    write_file(root / "ckpt_0" / "frozen.bin", frozen)
    stones = MemoryTombstones()

    class NextReport(MemoryJournal):
        def put(self, rel: str, record: FileRecord) -> None:
            super().put(rel, record)
            if rel == "ckpt_0/frozen.bin" and not (root / "ckpt_1").exists():
                write_file(root / "ckpt_1" / "frozen.bin", frozen)
                stones.add("ckpt_0")
                (root / "ckpt_0" / "frozen.bin").unlink()
                (root / "ckpt_0").rmdir()

    drainer = Drainer(Drain(str(root), target, SMALL, stones, threading.Lock(), NextReport()))
    drainer.start()
    try:
        drained(drainer)
        status = drained(drainer)
    finally:
        drainer.stop()
    assert (root / "ckpt_1").exists()
    assert status.uploaded_bytes == len(frozen) and status.copied_bytes == len(frozen)
    assert status.deletes_pending == 0
    assert_same(root, target)


def _confirmed(drainer: Drainer) -> None:
    """Wait for a pass that confirmed everything in the tier first."""
    from tests.support.waiting import eventually

    ticket = drainer.request(confirm=True)
    eventually(
        lambda: drainer.status().confirmed >= ticket,
        lambda: f"a confirming pass after ticket {ticket}: {drainer.status()}",
        60,
    )
