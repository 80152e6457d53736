"""Running one layout: an actor pair per contender, warmed up once, and every size
with the repeats interleaved across contenders; progress lines on stderr."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from typing import Any

import psutil

from air_transfer.bench.contenders import contender_function
from air_transfer.bench.data import GB
from air_transfer.bench.endpoint import Ends
from air_transfer.bench.measure import Measurement, error_reason, measure_once, skip_reason
from air_transfer.bench.report import skipped, summarize
from air_transfer.bench.session import store_capacity
from air_transfer.config import TransferConfig


def warmup_size(config: TransferConfig, smallest_bytes: int) -> int:
    """Size of the untimed warm-up round trip each fresh actor pair makes first: two
    chunks, so that the chunk-size buffers a process allocates once (and whose
    fresh pages are slow on a VM) are not first met on the clock; never more than
    the smallest checkpoint measured, which every contender that runs can carry."""
    return min(2 * config.chunk_bytes, smallest_bytes)


def progress(message: str) -> None:
    """One line on stderr, flushed, so a long run is never silent."""
    print(message, file=sys.stderr, flush=True)


def run_layout(
    contenders: list[str],
    layout: str,
    sizes: list[tuple[float, int]],
    sources: dict[Any, Any],
    config: TransferConfig,
    opts: argparse.Namespace,
    progress_step: Iterator[str],
) -> list[dict[str, Any]]:
    """Every contender at every size (ascending) of one layout.

    Repeats are interleaved (rep 1 of every contender, then rep 2, ...) so a drift in
    the machine, such as a disk that slows down under someone else's load, spreads
    over all contenders instead of landing on one. Each contender keeps its own actor
    pair for the layout, so memory one contender leaves in a process is not counted
    against another.
    """
    rows: list[dict[str, Any]] = []
    pairs: dict[str, Ends] = {}
    margin = int(opts.memory_margin_gb * GB)
    try:
        for size_gb, nbytes in sizes:
            src, source = sources[layout, nbytes]
            runs: dict[str, list[Measurement]] = {}
            for name in contenders:
                available = psutil.virtual_memory().available
                reason = skip_reason(name, nbytes, config, available, margin, store_capacity())
                if reason:
                    steps = [next(progress_step) for _ in range(opts.repeats)]
                    progress(f"{steps[-1]} {name} {layout} {size_gb:g} GB: skipped: {reason}")
                    rows.append(skipped(name, layout, size_gb, nbytes, reason))
                else:
                    runs[name] = []
            for rep in range(1, opts.repeats + 1):
                for name, done in runs.items():
                    if done and done[-1].error:
                        next(progress_step)
                        continue
                    out = os.path.join(opts.data_dir, "out", f"{name}-{layout}-{nbytes}")
                    if name not in pairs:
                        pairs[name] = _start_pair(name, config, sources.get("warmup"), opts)
                    ends = pairs[name]
                    m = measure_once(name, ends, src, out, nbytes, source, opts)
                    done.append(m)
                    step = f"{next(progress_step)} {name} {layout} {size_gb:g} GB"
                    step += f" rep {rep}/{opts.repeats}"
                    if m.error:
                        progress(f"{step}: FAILED: {m.error}")
                        pairs.pop(name).kill()
                    elif m.trip is not None:
                        s = m.trip.seconds
                        progress(f"{step}: {s:.3f} s, {s / (nbytes / GB):.3f} s/GB, verified")
            rows += [summarize(n, layout, size_gb, nbytes, done) for n, done in runs.items()]
    finally:
        for ends in pairs.values():
            ends.kill()
    order = {name: i for i, name in enumerate(contenders)}
    return sorted(rows, key=lambda r: (r["bytes"], order[r["contender"]]))


def _start_pair(
    name: str,
    config: TransferConfig,
    warmup: tuple[str, int] | None,
    opts: argparse.Namespace,
) -> Ends:
    """A fresh actor pair for ``name``, warmed up unless ``--no-warmup`` by one
    untimed round trip of a small checkpoint (``warmup_size``) and by mapping most of
    the object store into both processes: imports (``ray.train`` alone takes ~0.5 s),
    first-use setup such as a strategy's agent actors, and first touches of the
    store's pages are paid once per process, not per checkpoint, and would otherwise
    land on the first repeats of whichever contender runs first at a size. A failed
    warm-up is reported and the measurements go ahead."""
    ends = Ends.start(config, opts.cross_node)
    if warmup is not None:
        warmup_src, warmup_bytes = warmup
        out = os.path.join(opts.data_dir, "out", f"{name}-warmup")
        try:
            contender_function(name)(ends, warmup_src, out, warmup_bytes)
        except Exception as e:  # the timed runs will fail the same way and say so
            progress(f"warm-up of {name} failed: {error_reason(e, False, 0)}")
        finally:
            shutil.rmtree(out, ignore_errors=True)
        try:
            ends.warm_store()
        except Exception as e:
            progress(f"object-store warm-up for {name} failed: {error_reason(e, False, 0)}")
    return ends
