"""``bench --readers N``: N readers on N nodes restore one checkpoint in node storage
at once, and the storage node reads it from its disk once; with ``--replicas K``,
from K copies (the storage node and K-1 copy nodes, no reader on them), and Ray's
bytes pushed per node (``pushed``) show how the readers spread over the copies.

A mock cluster of the storage node (the head, the driver's) and N reader nodes, one
warmed-up ``Endpoint`` actor on each. The checkpoint is the bench's own on the
storage node's disk; each reader runs ``Checkpoint(path,
filesystem=storage_filesystem(node=storage node)).to_directory()``. Each repeat, with
the storage agent's read cache emptied first each time: one reader alone (the
first), then all N at once. Reported: the wall time of the N together (driver,
submit to last done) against the one alone in the same repeat, every reader's own
time, the storage agents' counters over each phase (summed over the copies): bytes
read from disk and bytes served, as multiples of the checkpoint (N readers once:
1.0 per copy used and N), and per node the bytes Ray's object manager pushed and
received (``pushed.py``; a checkpoint restored whole by each of N readers from one
node: 1.0 pushed there when the readers after the first read its relay on the first
reader's node, ``transfer.fanout``, which pushes the rest with the readers; N when
every reader pulls it from the storage node).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import pyarrow.fs as pafs
import ray
import ray.train

from air_transfer import TransferConfig, node_agent, storage_filesystem
from air_transfer.train.hooks import upload_directory
from benchmarks.bench import pushed
from benchmarks.bench.contenders import Trip
from benchmarks.bench.data import first_difference
from benchmarks.bench.endpoint import WARM_STORE_FRACTION, start_endpoint, warm_agent
from benchmarks.bench.measure import Measurement, error_reason
from benchmarks.bench.report import pushed_text, run_config, summarize
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
    "served_ratio": "bytes the storage agents served / checkpoint size",
    "pushed": "per repeat, per node: bytes Ray's object manager pushed from it and "
    "received (ray_object_manager_bytes by Type) / checkpoint size",
    "ratio_to_one": "median n-readers time / median one-reader time",
    "size_gb": "decimal GB (10**9 bytes)",
}


def reader_nodes(count: int) -> list[str]:
    """The custom resource of each reader node."""
    return [f"reader_{i}" for i in range(1, count + 1)]


def copy_nodes(replicas: int) -> list[str]:
    """The custom resource of each node holding a copy besides the storage node."""
    return [f"copy_{i}" for i in range(1, replicas)]


def _counters(agents: list[Any]) -> dict[str, int]:
    """The agents' read counters, summed."""
    total: dict[str, int] = {}
    for counters in ray.get([agent.read_counters.remote() for agent in agents]):
        for k, v in counters.items():
            total[k] = total.get(k, 0) + v
    return total


Phase = tuple[Measurement, list[float], dict[str, int], pushed.Bytes]


def _phase(
    readers: list[Any],
    checkpoint: ray.train.Checkpoint,
    out_base: str,
    agents: list[Any],
    source: dict[str, Any],
) -> Phase:
    """All ``readers`` restore ``checkpoint`` at once, the read caches emptied
    first: the measurement, each reader's seconds, the counters' deltas and the
    bytes Ray moved per node."""
    ray.get([agent.clear_read_cache.remote() for agent in agents])
    os.sync()
    urls = pushed.endpoints()
    moved_before = pushed.snapshot(urls)
    before = _counters(agents)
    start = time.perf_counter()
    calls = [r.restore.remote(checkpoint, f"{out_base}-{i}") for i, r in enumerate(readers)]
    try:
        done = ray.get(calls)
    except Exception as e:
        return Measurement(None, error_reason(e, False, 0), {}, 0), [], {}, {}
    seconds = time.perf_counter() - start
    after = _counters(agents)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    moved = pushed.delta(moved_before, pushed.snapshot(urls, changed_from=moved_before))
    differences = [first_difference(source, digest) for _, digest in done]
    wrong = next((d for d in differences if d), None)
    trip = Trip(seconds, verified=wrong is None)
    error = None if wrong is None else f"a reader's output differs from the source: {wrong}"
    return Measurement(trip, error, {}, 0), [s for s, _ in done], delta, moved


def _row(
    name: str,
    layout: str,
    size_gb: float,
    nbytes: int,
    runs: list[Phase],
    readers: int,
    names: dict[str, str],
) -> dict[str, Any]:
    row = summarize(name, layout, size_gb, nbytes, [m for m, _, _, _ in runs])
    per_reader = [round(s, 4) for _, seconds, _, _ in runs for s in seconds]
    ratios = {
        key: [round(delta.get(f"bytes_{key}", 0) / nbytes, 3) for _, _, delta, _ in runs if delta]
        for key in ("read", "served")
    }
    return {
        **row,
        "readers": readers,
        "reader_seconds": per_reader,
        "reader_median_s": round(statistics.median(per_reader), 4) if per_reader else None,
        "read_ratio": ratios["read"],
        "served_ratio": ratios["served"],
        "pushed": [pushed.pushed_ratios(moved, nbytes, names) for _, _, _, moved in runs if moved],
    }


def run_readers(opts: argparse.Namespace) -> dict[str, Any]:
    """The ``--readers N`` run (see the module docstring); returns the JSON report."""
    count, copies = opts.readers, copy_nodes(opts.replicas)
    nodes = [STORAGE_NODE, *copies, *reader_nodes(count)]
    setup = prepare(opts, len(nodes))
    results: list[dict[str, Any]] = []
    system_config = {"metrics_report_interval_ms": pushed.REPORT_MS}
    with ray_session(
        True, opts.num_cpus, setup.store_bytes, nodes, system_config=system_config
    ) as how:
        progress(
            f"{how}: storage node {STORAGE_NODE} (the driver's), {len(copies)} more "
            f"copies, {count} readers"
        )
        storage = str(ray.get_runtime_context().get_node_id())
        names = {
            n["NodeID"]: next((r for r in nodes if r in n["Resources"]), n["NodeID"][:12])
            for n in ray.nodes()
            if n["Alive"]
        }
        ids = {name: node for node, name in names.items()}
        agents = [node_agent(ids[n]) for n in [STORAGE_NODE, *copies]]
        readers = [start_endpoint(node) for node in nodes[1 + len(copies) :]]
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
                        opts, setup.config, [ids[n] for n in copies], agents, readers,
                        layout, size_gb, nbytes, src, source, names,
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


def stored_checkpoint(
    opts: argparse.Namespace, config: TransferConfig, copies: list[str], src: str
) -> tuple[ray.train.Checkpoint, pafs.FileSystem, str | None]:
    """The bench's checkpoint in node storage on the driver's node: ``src`` itself
    (one copy), or stored into a ``replicas=K`` storage on it and the ``copies``
    nodes (each copy under ``<data-dir>/replicas/<node id>``); and the replicated
    directory to delete after."""
    storage = str(ray.get_runtime_context().get_node_id())
    if not copies:
        fs = storage_filesystem(node=storage, config=config, root=os.path.dirname(src))
        return ray.train.Checkpoint(src, filesystem=fs), fs, None
    base = os.path.join(opts.data_dir, "replicas")
    fs = storage_filesystem(
        node=storage,
        config=config,
        root=os.path.join(base, storage),
        replicas=1 + len(copies),
        replica_nodes=tuple(copies),
        replica_root=os.path.join(base, "{node_id}"),
    )
    path = os.path.join(base, storage, os.path.basename(src))
    progress(f"  storing the checkpoint on {1 + len(copies)} copies")
    upload_directory(fs, path, ray.train.Checkpoint.from_directory(src))
    return ray.train.Checkpoint(path, filesystem=fs), fs, path


def _measure_size(
    opts: argparse.Namespace,
    config: TransferConfig,
    copies: list[str],
    agents: list[Any],
    readers: list[Any],
    layout: str,
    size_gb: float,
    nbytes: int,
    src: str,
    source: dict[str, Any],
    names: dict[str, str],
) -> list[dict[str, Any]]:
    """The repeats of one checkpoint: one reader alone, then all at once."""
    checkpoint, fs, replicated = stored_checkpoint(opts, config, copies, src)
    out = os.path.join(opts.data_dir, "out", f"readers-{nbytes}")
    runs: dict[str, list[Phase]] = {ONE: [], ALL: []}
    for rep in range(1, opts.repeats + 1):
        for name, group in ((ONE, readers[:1]), (ALL, readers)):
            result = _phase(group, checkpoint, out, agents, source)
            runs[name].append(result)
            m, _, delta, moved = result
            what = f"{name} ({len(group)}) {layout} {size_gb:g} GB rep {rep}/{opts.repeats}"
            if m.error or m.trip is None:
                progress(f"  {what}: FAILED: {m.error}")
            else:
                read = delta.get("bytes_read", 0) / nbytes
                spread = pushed_text(pushed.pushed_ratios(moved, nbytes, names))
                progress(
                    f"  {what}: {m.trip.seconds:.3f} s, read {read:.2f}x, verified; pushed {spread}"
                )
    if replicated is not None:
        fs.delete_dir(replicated)
    rows = [
        _row(name, layout, size_gb, nbytes, group_runs, 1 if name == ONE else len(readers), names)
        for name, group_runs in runs.items()
    ]
    one = rows[0]["median_s"]
    for row in rows:
        row["ratio_to_one"] = round(row["median_s"] / one, 3) if one and row["median_s"] else None
    return rows
