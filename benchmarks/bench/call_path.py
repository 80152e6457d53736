"""``bench --call``: how long ``to_object_ref_async`` blocks its caller, alone.

The main run times the call inside each round trip, at sizes this machine can move.
This run times only the call, in a producer actor as there, at any size: a
checkpoint of one file of each ``--sizes`` made sparse with ``truncate`` (no disk,
no page cache: the call reads no data, it scans and checks, and hands the packing
tasks to a background thread), and a tree of ``--small-files`` files of
``--small-file-kib`` (real data, cached in ``--data-dir``). Right after each call the
sparse file's mtime is bumped, so its packing stops at the next chunk with
SourceChangedError, as a checkpoint changed while packed must, and the store never
holds it; the tree is packed to the end, and its manifest checked. Figures per case:
wall seconds of the call (median, min, max of ``--repeats``, after one untimed
call) against the bar, and the CPU seconds the calling thread spent.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import ray

from air_transfer import ChunkedCheckpoint, SourceChangedError, TransferConfig
from benchmarks.bench.data import GB, make_checkpoint
from benchmarks.bench.runner import progress
from benchmarks.bench.session import machine_info, ray_session
from benchmarks.units import MiB

#: The bars of the call (docs/performance.md): seconds at 8 GB and at 20,000 files
#: (other cases are reported without one).
BAR_8GB_S = 0.050
BAR_20K_FILES_S = 0.100
DEFAULT_SMALL_FILES = 20_000


class Caller:
    """The producer: makes the non-blocking call and says how long it blocked."""

    def call(self, src: str, config: TransferConfig, touch: str | None) -> dict[str, Any]:
        wall, cpu = time.perf_counter(), time.thread_time()
        future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(config=config)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        if touch is not None:  # stop packing: the file is no longer the one scanned
            os.utime(touch, ns=(time.time_ns(), time.time_ns()))
        try:
            future.result(timeout=600)
        except SourceChangedError:
            if touch is None:
                raise
            return {"call_s": wall, "cpu_s": cpu, "outcome": "stopped", "files": None}
        files = sum(1 for _ in ChunkedCheckpoint.from_object_ref(future).manifest.files())
        return {"call_s": wall, "cpu_s": cpu, "outcome": "packed", "files": files}


def sparse_checkpoint(data_dir: str, size_bytes: int) -> tuple[str, str]:
    """A directory holding one sparse file of ``size_bytes`` (no blocks on disk), and
    that file."""
    path = os.path.join(data_dir, f"sparse-{size_bytes}B")
    os.makedirs(path, exist_ok=True)
    model = os.path.join(path, "model.bin")
    with open(model, "ab") as f:
        f.truncate(size_bytes)
    return path, model


def run_call(opts: argparse.Namespace) -> dict[str, Any]:
    """Time the call at every size (sparse) and for the small-file tree."""
    data_dir = os.path.abspath(os.path.expanduser(opts.data_dir))
    os.makedirs(data_dir, exist_ok=True)
    config = TransferConfig(chunk_bytes=opts.chunk_mib * MiB, window=opts.window,
                            strategy="chunked", progress=False)  # fmt: skip
    small_bytes = opts.small_file_kib * 1024
    count = opts.small_files or DEFAULT_SMALL_FILES
    cases: list[tuple[str, str, str | None, int, int, float | None]] = []
    for size_gb in sorted(opts.sizes):
        size = round(size_gb * GB)
        src, model = sparse_checkpoint(data_dir, size)
        bar = BAR_8GB_S if size == 8 * GB else None
        cases.append((f"{size_gb:g} GB sparse", src, model, size, 1, bar))
    tree = make_checkpoint(data_dir, "small", count * small_bytes, small_bytes)
    bar = BAR_20K_FILES_S if count == DEFAULT_SMALL_FILES else None
    cases.append((f"{count} files", tree, None, count * small_bytes, count, bar))
    results = []
    store = 256 * MiB + 3 * count * small_bytes
    with ray_session(False, opts.num_cpus, store) as how:
        progress(f"{how}: timing the call of {len(cases)} checkpoints, {opts.repeats} times each")
        caller: Any = ray.remote(num_cpus=0)(Caller).remote()
        for name, src, touch, nbytes, files, bar in cases:
            # One untimed call first: it warms the agent and the caller's imports.
            calls = [caller.call.remote(src, config, touch) for _ in range(opts.repeats + 1)]
            runs = [ray.get(c) for c in calls][1:]
            results.append(_result(name, nbytes, files, bar, runs))
            progress(f"{name}: call {results[-1]['call_median_s'] * 1e3:.1f} ms (median)")
    return {"mode": "call", "config": {"repeats": opts.repeats, "chunk_mib": opts.chunk_mib},
            "machine": machine_info(data_dir), "results": results}  # fmt: skip


def _result(
    name: str, nbytes: int, files: int, bar: float | None, runs: list[dict[str, Any]]
) -> dict[str, Any]:
    calls = [r["call_s"] for r in runs]
    median = statistics.median(calls)
    expected = "stopped" if name.endswith("sparse") else "packed"
    ok = all(r["outcome"] == expected and r["files"] in (None, files) for r in runs)
    return {
        "case": name, "bytes": nbytes, "files": files, "call_seconds": calls,
        "call_median_s": median, "call_min_s": min(calls), "call_max_s": max(calls),
        "cpu_median_s": statistics.median(r["cpu_s"] for r in runs),
        "bar_s": bar, "bar_met": None if bar is None else median <= bar,
        "outcomes": sorted({r["outcome"] for r in runs}), "verified": ok,
        "status": "ok" if ok else "failed",
    }  # fmt: skip


def format_call_table(rows: list[dict[str, Any]]) -> str:
    """Per case: the call's wall ms (median, min-max), its thread's CPU ms, the bar."""
    lines = ["{:<16} {:>9} {:>15} {:>8} {:>8} {:>4} {:>3}".format(
        "case", "call_ms", "min-max", "cpu_ms", "bar_ms", "met", "ok")]  # fmt: skip
    for r in rows:
        bar = "-" if r["bar_s"] is None else f"{r['bar_s'] * 1e3:.0f}"
        met = "-" if r["bar_met"] is None else ("yes" if r["bar_met"] else "NO")
        spread = f"{r['call_min_s'] * 1e3:.1f}-{r['call_max_s'] * 1e3:.1f}"
        ok = "yes" if r["verified"] else "NO"
        lines.append(
            f"{r['case']:<16} {r['call_median_s'] * 1e3:>9.1f} {spread:>15} "
            f"{r['cpu_median_s'] * 1e3:>8.1f} {bar:>8} {met:>4} {ok:>3}"
        )
    return "\n".join(lines)
