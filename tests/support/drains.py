"""Drains of node storage into a durable tier, run in the test's process (no Ray):
start one, wait for a pass that began after a request, compare the two tiers."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs

from air_transfer.storage.durable.reads import TierReads
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.status import DrainStatus
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.tombstones import MemoryTombstones
from air_transfer.storage.server.drain.loop import Drainer
from air_transfer.storage.server.drain.passes import Drain
from air_transfer.storage.server.drain.scan import scan_storage
from tests.support.waiting import eventually

SMALL = DrainSettings(chunk_bytes=64 * 1024, rescan_s=60.0, backoff_s=(0.05, 0.5), lead_poll_s=0.05)


@contextlib.contextmanager
def draining(
    root: Path, target: DurableTarget, settings: DrainSettings = SMALL
) -> Iterator[Drainer]:
    work = Drain(str(root), target, settings, MemoryTombstones(), threading.Lock())
    drainer = Drainer(work).start()
    try:
        yield drainer
    finally:
        drainer.stop()


def drained(drainer: Drainer, timeout_s: float = 60) -> DrainStatus:
    """Wait until a pass that started after now ended well; its status."""
    ticket = drainer.request()
    return eventually(
        lambda: (s := drainer.status()).completed >= ticket and s,
        lambda: f"a drain pass after ticket {ticket}: {drainer.status()}",
        timeout_s,
    )


def local_target(path: Path) -> DurableTarget:
    path.mkdir(parents=True, exist_ok=True)
    return DurableTarget.parse(f"file://{path}")


def assert_same(root: Path, target: DurableTarget) -> None:
    """Every file of node storage ``root`` is in the tier, bit-identical, with a record
    of its size; and the tier holds no other file (its own records aside)."""
    fs = target.filesystem
    files = scan_storage(str(root)).files
    reads = TierReads(target, ttl_s=0)
    for rel, seen in files.items():
        with fs.open_input_stream(target.path(rel)) as f:
            assert f.read() == (root / rel).read_bytes(), rel
        record = reads.record(rel)
        assert record is not None and record.size == seen.size, rel
    held = {
        target.rel(i.path)
        for i in fs.get_file_info(pafs.FileSelector(target.base, recursive=True))
        if i.type == pafs.FileType.File
    }
    assert {r for r in held if not r.startswith(".air-transfer/")} == set(files)
