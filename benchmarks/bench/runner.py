"""Running one layout: an actor pair per contender, warmed up once, and every size
with the repeats interleaved across contenders; progress lines on stderr."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psutil

from air_transfer import TransferConfig
from benchmarks.bench.contenders import contender_function
from benchmarks.bench.data import GB, checkpoint_sizes, make_checkpoint, tree_digest
from benchmarks.bench.endpoint import Ends
from benchmarks.bench.measure import Measurement, error_reason, measure_once, skip_reason
from benchmarks.bench.report import skipped, summarize
from benchmarks.bench.session import auto_store_bytes, prefault_memory, store_capacity
from benchmarks.units import MiB


def warmup_size(config: TransferConfig, smallest_bytes: int) -> int:
    """Size of the untimed warm-up round trip each fresh actor pair makes first: two
    chunks, so that the chunk-size buffers a process allocates once (and whose
    fresh pages are slow on a VM) are not first met on the clock; never more than
    the smallest checkpoint measured, which every contender that runs can carry."""
    return min(2 * config.chunk_bytes, smallest_bytes)


def progress(message: str) -> None:
    """One line on stderr, flushed, so a long run is never silent."""
    print(message, file=sys.stderr, flush=True)


@dataclass
class Setup:
    """What every mode of the bench prepares before starting Ray: the transfer
    config from the flags, the sizes per layout, the checkpoints and the object
    store's size per node."""

    config: TransferConfig
    plan: dict[str, list[tuple[float, int]]]
    sources: dict[Any, Any]
    store_bytes: int


def prepare(opts: argparse.Namespace, nodes: int) -> Setup:
    """The ``Setup`` of a run on ``nodes`` nodes; makes ``opts.data_dir`` absolute
    (the actors do not share the driver's working directory), touches free memory
    once unless ``--no-prefault``, and writes the checkpoints not cached yet."""
    config = TransferConfig(
        chunk_bytes=opts.chunk_mib * MiB,
        window=opts.window,
        direct_io=opts.direct_io,
        # Explicit: AIR_TRANSFER_PROGRESS in the environment never turns bars on in
        # the timed runs.
        progress=opts.progress,
    )
    opts.data_dir = os.path.abspath(os.path.expanduser(opts.data_dir))
    os.makedirs(opts.data_dir, exist_ok=True)
    plan = {layout: checkpoint_sizes(opts, layout) for layout in opts.layout}
    largest = max(n for sizes in plan.values() for _, n in sizes)
    store = opts.object_store_mb * MiB if opts.object_store_mb else None
    store = store or auto_store_bytes(largest, nodes > 1, nodes)
    if opts.prefault:
        progress("prefaulting memory (first touch of a VM's memory is several times slower)")
        prefault_memory(int(opts.memory_margin_gb * GB))
    return Setup(config, plan, prepare_sources(opts, plan, config), store)


def prepare_sources(
    opts: argparse.Namespace, plan: dict[str, list[tuple[float, int]]], config: TransferConfig
) -> dict[Any, Any]:
    """Every checkpoint of ``plan`` (layout -> sizes), written once into
    ``opts.data_dir`` and digested: ``(layout, bytes) -> (path, digest)``; and, with
    the warm-up on, ``"warmup" -> (path, bytes)`` (see ``warmup_size``)."""
    sources: dict[Any, Any] = {}
    for layout, sizes in plan.items():
        for size_gb, nbytes in sizes:
            progress(f"checkpoint {layout} {size_gb:g} GB ({nbytes} bytes) in {opts.data_dir}")
            path = make_checkpoint(
                opts.data_dir, layout, round(size_gb * GB), opts.small_file_kib * 1024
            )
            sources[layout, nbytes] = (path, tree_digest(path))
    if opts.warmup:
        smallest = min(n for sizes in plan.values() for _, n in sizes)
        warmup_bytes = warmup_size(config, smallest)
        sources["warmup"] = (make_checkpoint(opts.data_dir, "big", warmup_bytes, 0), warmup_bytes)
    return sources


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
                        pairs[name] = start_pair(name, config, sources.get("warmup"), opts)
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
                        cpu = " ".join(f"{k} {v:.2f}" for k, v in (m.cpu_s or {}).items())
                        rate = f"{s:.3f} s, {s / (nbytes / GB):.3f} s/GB"
                        progress(f"{step}: {rate}, verified; CPU s: {cpu}")
            rows += [summarize(n, layout, size_gb, nbytes, done) for n, done in runs.items()]
    finally:
        for ends in pairs.values():
            ends.kill()
    order = {name: i for i, name in enumerate(contenders)}
    return sorted(rows, key=lambda r: (r["bytes"], order[r["contender"]]))


def start_pair(
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
