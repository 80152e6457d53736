"""``bench --readers N``: N readers on N nodes restore one checkpoint in node storage
at once, and the storage node reads it from its disk once.

A mock cluster of the storage node (the head, the driver's) and N reader nodes, one
warmed-up ``Endpoint`` actor on each. The checkpoint is the bench's own on the
storage node's disk; each reader runs ``Checkpoint(path,
filesystem=storage_filesystem(storage node)).to_directory()``. Each repeat, with
the storage agent's read cache emptied first each time: one reader alone (the
first), then all N at once. Reported: the wall time of the N together (driver,
submit to last done) against the one alone in the same repeat, every reader's own
time, and the storage agent's counters over each phase: bytes read from its disk
and bytes served, as multiples of the checkpoint (N readers once: 1.0 and N).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import ray
import ray.train

from air_transfer import TransferConfig, node_agent, storage_filesystem
from benchmarks.bench.contenders import Trip
from benchmarks.bench.data import first_difference
from benchmarks.bench.endpoint import WARM_STORE_FRACTION, start_endpoint, warm_agent
from benchmarks.bench.measure import Measurement, error_reason
from benchmarks.bench.report import run_config, summarize
from benchmarks.bench.runner import prepare, progress
from benchmarks.bench.sampler import object_store_used, wait_for_store_at_most
from benchmarks.bench.session import machine_info, ray_session

STORAGE_NODE = "node_a"
ONE = "one-reader"
ALL = "n-readers"
READERS_METRICS = {
    "seconds": "driver wall clock from submitting the readers' to_directory() to the "
    "last one done (one-reader: the first reader alone)",
    "reader_seconds": "each reader's own to_directory() time, in its actor",
    "read_ratio": "bytes the storage node's agent read from disk / checkpoint size "
    "(per repeat; 1.0 = read once)",
    "served_ratio": "bytes the storage agent served / checkpoint size",
    "ratio_to_one": "median n-readers time / median one-reader time",
    "size_gb": "decimal GB (10**9 bytes)",
}


def reader_nodes(count: int) -> list[str]:
    """The custom resource of each reader node."""
    return [f"reader_{i}" for i in range(1, count + 1)]


def _counters(agent: Any) -> dict[str, int]:
    counters: dict[str, int] = ray.get(agent.read_counters.remote())
    return counters


def _phase(
    readers: list[Any],
    checkpoint: ray.train.Checkpoint,
    out_base: str,
    agent: Any,
    source: dict[str, Any],
) -> tuple[Measurement, list[float], dict[str, int]]:
    """All ``readers`` restore ``checkpoint`` at once, the read cache emptied
    first: the measurement, each reader's seconds and the counters' deltas."""
    ray.get(agent.clear_read_cache.remote())
    os.sync()
    before = _counters(agent)
    start = time.perf_counter()
    calls = [r.restore.remote(checkpoint, f"{out_base}-{i}") for i, r in enumerate(readers)]
    try:
        done = ray.get(calls)
    except Exception as e:
        return Measurement(None, error_reason(e, False, 0), {}, 0), [], {}
    seconds = time.perf_counter() - start
    after = _counters(agent)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    differences = [first_difference(source, digest) for _, digest in done]
    wrong = next((d for d in differences if d), None)
    trip = Trip(seconds, verified=wrong is None)
    error = None if wrong is None else f"a reader's output differs from the source: {wrong}"
    return Measurement(trip, error, {}, 0), [s for s, _ in done], delta


def _row(
    name: str,
    layout: str,
    size_gb: float,
    nbytes: int,
    runs: list[tuple[Measurement, list[float], dict[str, int]]],
    readers: int,
) -> dict[str, Any]:
    row = summarize(name, layout, size_gb, nbytes, [m for m, _, _ in runs])
    per_reader = [round(s, 4) for _, seconds, _ in runs for s in seconds]
    ratios = {
        key: [round(delta.get(f"bytes_{key}", 0) / nbytes, 3) for _, _, delta in runs if delta]
        for key in ("read", "served")
    }
    return {
        **row,
        "readers": readers,
        "reader_seconds": per_reader,
        "reader_median_s": round(statistics.median(per_reader), 4) if per_reader else None,
        "read_ratio": ratios["read"],
        "served_ratio": ratios["served"],
    }


def run_readers(opts: argparse.Namespace) -> dict[str, Any]:
    """The ``--readers N`` run (see the module docstring); returns the JSON report."""
    count = opts.readers
    nodes = [STORAGE_NODE, *reader_nodes(count)]
    setup = prepare(opts, len(nodes))
    results: list[dict[str, Any]] = []
    with ray_session(True, opts.num_cpus, setup.store_bytes, nodes) as how:
        progress(f"{how}: storage node {STORAGE_NODE} (the driver's), {count} readers")
        storage = str(ray.get_runtime_context().get_node_id())
        agent = node_agent(storage)
        readers = [start_endpoint(node) for node in nodes[1:]]
        try:
            if opts.warmup:
                progress("warming up: the store mapped into each reader and the storage agent")
                before = object_store_used()
                for reader in readers:
                    ray.get(reader.fill_store.remote(WARM_STORE_FRACTION))
                warm_agent(storage, WARM_STORE_FRACTION)
                wait_for_store_at_most(before + 64 * 1024 * 1024, timeout_s=10.0)
            for layout, sizes in setup.plan.items():
                for size_gb, nbytes in sizes:
                    src, source = setup.sources[layout, nbytes]
                    results += _measure_size(
                        opts, setup.config, storage, agent, readers, layout, size_gb,
                        nbytes, src, source,
                    )  # fmt: skip
        finally:
            for reader in readers:
                ray.kill(reader)
        store = ray.cluster_resources().get("object_store_memory", 0) / len(nodes)
    return {
        "mode": "readers",
        "config": run_config(opts, setup.config, [ONE, ALL], store, READERS_METRICS),
        "machine": machine_info(opts.data_dir),
        "results": results,
    }


def _measure_size(
    opts: argparse.Namespace,
    config: TransferConfig,
    storage: str,
    agent: Any,
    readers: list[Any],
    layout: str,
    size_gb: float,
    nbytes: int,
    src: str,
    source: dict[str, Any],
) -> list[dict[str, Any]]:
    """The repeats of one checkpoint: one reader alone, then all at once."""
    fs = storage_filesystem(storage, config, root=os.path.dirname(src))
    checkpoint = ray.train.Checkpoint(src, filesystem=fs)
    out = os.path.join(opts.data_dir, "out", f"readers-{nbytes}")
    runs: dict[str, list[tuple[Measurement, list[float], dict[str, int]]]] = {ONE: [], ALL: []}
    for rep in range(1, opts.repeats + 1):
        for name, group in ((ONE, readers[:1]), (ALL, readers)):
            result = _phase(group, checkpoint, out, agent, source)
            runs[name].append(result)
            m, _, delta = result
            what = f"{name} ({len(group)}) {layout} {size_gb:g} GB rep {rep}/{opts.repeats}"
            if m.error or m.trip is None:
                progress(f"  {what}: FAILED: {m.error}")
            else:
                read = delta.get("bytes_read", 0) / nbytes
                progress(f"  {what}: {m.trip.seconds:.3f} s, read {read:.2f}x, verified")
    rows = [
        _row(name, layout, size_gb, nbytes, group_runs, 1 if name == ONE else len(readers))
        for name, group_runs in runs.items()
    ]
    one = rows[0]["median_s"]
    for row in rows:
        row["ratio_to_one"] = round(row["median_s"] / one, 3) if one and row["median_s"] else None
    return rows
