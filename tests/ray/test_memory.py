"""No code path holds the whole checkpoint in memory: the private memory (RssAnon, not
RSS, which counts mapped object-store pages) of producer and consumer grows by a few
chunks, not by the checkpoint size. A memory bound, not a timing one."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

from air_transfer import ChunkedCheckpoint, TransferConfig

pytestmark = pytest.mark.usefixtures("ray_local")
MiB = 1024 * 1024
CHECKPOINT = 192 * MiB
CONFIG = TransferConfig(chunk_bytes=2 * MiB, window=4, strategy="chunked")
# 3 read buffers on the producer, `window` fetched views (shared memory) on the
# consumer, plus slack for the allocator and Ray's own bookkeeping.
BOUND = 4 * CONFIG.chunk_bytes + 48 * MiB


def rss_anon() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no RssAnon in /proc/self/status")


def peak_growth(work: Callable[[], Any]) -> tuple[int, Any]:
    """Private-memory high water above the starting point while ``work`` runs."""
    start = rss_anon()
    peak = start
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss_anon())
            done.wait(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        result = work()
    finally:
        done.set()
        sampler.join()
    return max(peak, rss_anon()) - start, result


@ray.remote(num_cpus=0)
def produce(src: str) -> tuple[int, list]:
    growth, ref = peak_growth(
        lambda: ChunkedCheckpoint.from_directory(src).to_object_ref(config=CONFIG)
    )
    return growth, [ChunkedCheckpoint.from_object_ref(ref)]


@ray.remote(num_cpus=0)
def consume(ckpt: ChunkedCheckpoint, target: str) -> int:
    growth, _ = peak_growth(lambda: ckpt.to_directory(target))
    return growth


def test_producer_and_consumer_memory_stay_within_a_few_chunks(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    with open(src / "weights.bin", "wb") as f:
        for _ in range(CHECKPOINT // (16 * MiB)):
            f.write(os.urandom(16 * MiB))
    producer_growth, (restored,) = ray.get(produce.remote(str(src)))
    consumer_growth = ray.get(consume.remote(restored, str(tmp_path / "out")))
    assert (tmp_path / "out" / "weights.bin").stat().st_size == CHECKPOINT
    assert producer_growth < BOUND, f"producer grew {producer_growth / MiB:.0f} MiB"
    assert consumer_growth < BOUND, f"consumer grew {consumer_growth / MiB:.0f} MiB"
