"""One measurement: whether a contender may run here at all (its predicted peak memory
against what is available), then one sampled, verified round trip."""

from __future__ import annotations

import argparse
import os
import shutil
import time
from dataclasses import dataclass
from typing import Any

from air_transfer import TransferConfig
from benchmarks.bench import cpu
from benchmarks.bench.contenders import (
    LOCAL_COPIES,
    RAW,
    Trip,
    contender_function,
    packs_in_agent,
)
from benchmarks.bench.data import GB, first_difference, tree_digest
from benchmarks.bench.endpoint import Ends
from benchmarks.bench.sampler import Sampler
from benchmarks.bench.session import drop_caches
from benchmarks.units import GiB, MiB

#: How long the driver keeps a finished round trip's objects referenced, so that the
#: object-store sampler sees them even when the trip was shorter than the raylets'
#: ~100 ms report period.
HOLD_S = 0.25
#: Predicted peak memory (private + object store) as a multiple of the checkpoint.
#: blob: the tar stream, its ``getvalue`` copy, the pickled put, the object and the
#: consumer's copy; ray-project/ray#25217 reported ~8x, this bench measured ~7x at
#: 0.5 GB (producer 2.5 GiB + consumer 0.6 + store 0.5). tune: the pack actor holds
#: the tar ``BytesIO`` and a ``read()`` copy of each chunk, the unpacking side a
#: chunk copy and its own ``BytesIO``, plus the chunk in the store: ~5.5x measured
#: at 0.5 GB (1.0 + 1.0 + 0.5 GiB); predicted with headroom.
BLOB_MEMORY_FACTOR = 8
TUNE_MEMORY_FACTOR = 6


def predicted_peak_bytes(
    contender: str, size_bytes: int, config: TransferConfig, store_bytes: int | None = None
) -> int:
    """Memory (private + object store) one round trip of ``contender`` is expected to
    need on this machine for a checkpoint of ``size_bytes``.

    Chunked contenders hold a few chunks privately and the checkpoint in the object
    store, which is capped by its capacity (``store_bytes``; Ray spills the rest to
    disk). ``cp`` needs only the page cache, which the kernel can always reclaim.
    """
    in_store = size_bytes if store_bytes is None else min(size_bytes, store_bytes)
    if contender in LOCAL_COPIES:
        return 0
    if contender == "blob":
        return BLOB_MEMORY_FACTOR * size_bytes
    if contender == "tune":
        return TUNE_MEMORY_FACTOR * size_bytes
    if contender == "inline":
        return 3 * size_bytes
    if contender == RAW:
        return in_store + 2 * config.window * config.chunk_bytes
    return in_store + 2 * (config.window + 3) * config.chunk_bytes


def skip_reason(
    contender: str,
    size_bytes: int,
    config: TransferConfig,
    available_bytes: int,
    margin_bytes: int,
    store_bytes: int | None = None,
) -> str | None:
    """Why ``contender`` must not run at ``size_bytes`` here, or None if it may."""
    if contender == "inline" and size_bytes > config.inline_limit:
        return (
            f"'inline' carries at most inline_limit={config.inline_limit / MiB:g} MiB "
            f"(window x chunk size bound); this checkpoint is {size_bytes / MiB:.0f} MiB"
        )
    need = predicted_peak_bytes(contender, size_bytes, config, store_bytes)
    if need > available_bytes - margin_bytes:
        return (
            f"predicted peak memory {need / GiB:.1f} GiB for {contender!r} exceeds the "
            f"{available_bytes / GiB:.1f} GiB available minus a {margin_bytes / GiB:.1f} GiB "
            "margin; skipped instead of risking the OOM killer"
        )
    return None


def error_reason(error: BaseException, aborted: bool, floor_bytes: int) -> str:
    if aborted:
        return (
            f"aborted: available memory fell under {floor_bytes / GiB:.1f} GiB, "
            "its actors were killed"
        )
    cause = getattr(error, "cause", None) or error
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"[:400]


@dataclass
class Measurement:
    trip: Trip | None
    error: str | None
    peaks: dict[str, int]
    store_peak: int
    #: CPU seconds per process role over the trip (``bench.cpu``).
    cpu_s: dict[str, float] | None = None


def measure_once(
    name: str,
    ends: Ends,
    src: str,
    out: str,
    nbytes: int,
    source: dict[str, Any],
    opts: argparse.Namespace,
) -> Measurement:
    """One sampled, verified round trip of contender ``name``; the output is deleted."""
    # Write back dirty pages first (untimed): data just generated, or written by the
    # previous trip, must not be flushed on this trip's clock.
    os.sync()
    if opts.drop_caches:
        drop_caches()  # cold start: the source is read from disk, not the page cache
    floor = int(opts.memory_margin_gb * GB / 2)
    producer = None if name in LOCAL_COPIES else ends.producer_pid
    agent = ends.agent_pid if packs_in_agent(name) else None
    pids = {"producer": producer, "consumer": ends.consumer_pid, "agent": agent}
    trip, error, cpu_s = None, None, None
    with Sampler(pids, floor, ends.kill) as sampler:
        ends.sampler = sampler
        try:
            before = cpu.snapshot(pids)
            trip = contender_function(name)(ends, src, out, nbytes)
            cpu_s = cpu.spent(before, cpu.snapshot(pids))
            if trip.hold is not None:
                time.sleep(HOLD_S)
                trip.hold = None
        except Exception as e:
            error = error_reason(e, sampler.aborted, floor)
        finally:
            ends.sampler = None
    if trip is not None and trip.verified is None:
        difference = first_difference(source, tree_digest(out)) if os.path.isdir(out) else None
        trip.verified = os.path.isdir(out) and difference is None
        if not trip.verified:
            error = f"output differs from the source: {difference or 'no output directory'}"
    elif trip is not None and not trip.verified:
        error = "the consumer's chunk hashes differ from the producer's"
    shutil.rmtree(out, ignore_errors=True)
    sampler.settle()
    return Measurement(trip, error, dict(sampler.peaks), sampler.store_peak, cpu_s)
