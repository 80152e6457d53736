"""``python -m benchmarks bench``: checkpoint transfer contenders side by side.

Every contender makes the same round trip: a *producer* process packs a checkpoint
directory, a different *consumer* process fetches it and writes it back out as files.
The output is verified byte for byte against the source, then deleted. The contenders:

- ``cp``: ``shutil.copytree`` in the consumer, no Ray at all: the floor.
- ``cp-direct``: the same copy with large files written with ``O_DIRECT``, as
  air-transfer writes them by default: the floor for output that reaches the disk
  (``cp``'s output is still in the page cache when its clock stops).
- ``blob``: the legacy AIR path that ray-project/ray#25217 measured: the directory
  tarred into one ``bytes``, one ``ray.put``, one ``ray.get``, untar.
- ``tune``: Ray Tune's own cross-node transfer (its pack actor and unpack task, from
  Tune's ``file_transfer`` module), as ``sync_dir_between_nodes`` uses them.
- every registered air-transfer strategy (``inline``, ``chunked``, ...), through the
  blocking ``to_object_ref``.
- ``chunked-async``: ``chunked`` through ``to_object_ref_async``: the producer's call
  returns once packing is submitted to its node's agent, and the consumer writes
  chunk i while later ones are still being packed.
- ``raw`` (default with ``--cross-node``): the same number of bytes as numpy chunks,
  ``ray.put`` by the producer and ``ray.get`` by the consumer, no files: Ray's own
  transfer ceiling.

What is measured, and how:

- seconds: wall clock in the driver around the whole round trip (``perf_counter``).
  For ``tune`` this includes starting the pack actor, as every Tune sync does.
- call seconds (``call_s``): how long the producer's call blocked it, timed in the
  producer: ``to_object_ref`` (which returns once every chunk is packed, so it is
  ``pack_s``) or ``to_object_ref_async`` (which returns once packing is submitted;
  its ``pack_s`` is until its future completed: the source free again).
- peak private memory: the high water of ``RssAnon`` in ``/proc/<pid>/status`` of the
  producer and of the consumer process, and for air-transfer's contenders of the
  producer node's agent (which packs the chunks), sampled every 20 ms by a driver
  thread.
  Plain RSS would also count the object-store pages a process maps (a zero-copy
  ``ray.get`` maps the whole object), which are not private and not the process's.
- object store: ``cluster_resources() - available_resources()`` of
  ``object_store_memory``, summed over nodes, sampled every 20 ms, minus its value
  when the measurement started. Raylets report it every ~100 ms (a 100 MiB put
  shows up about 90 ms later), so a peak shorter than that can be missed; the driver
  keeps a finished trip's objects referenced for 250 ms (untimed) so they are seen.

Repeats are interleaved (rep 1 of every contender, then rep 2) so a machine that
drifts, a disk slowed by someone else's load, does not land on one contender; each
contender has its own producer/consumer actor pair per layout, warmed up untimed by
one round trip of two chunks (at most the smallest checkpoint) and by mapping 70% of
the object store into both processes and into the agents of their nodes
(``--no-warmup`` to measure these first-use costs too).

A contender whose predicted memory would not fit (``blob`` needs ~8x the checkpoint,
``tune`` ~6x) is skipped with the reason, never run into the OOM killer; a watchdog
also kills a run if available memory falls under half the margin anyway.

Two other runs replace the contenders: ``--train`` (the Ray Train path through
``storage_filesystem``: report and restore, beside a local-filesystem Train run, raw
Ray and ``cp-direct``; see ``bench.train_path``), ``--dcp`` (torch DCP save and
restore from 2 ranks, Ray's recipe beside ``air_transfer.dcp``; see
``bench.dcp_path``), ``--readers N`` (N readers on N
nodes restoring one checkpoint from node storage at once; see ``bench.readers``) and
``--incremental`` (5 Train reports sharing 90% of their bytes, full beside
incremental node storage; see ``bench.incremental_path``) and ``--call``
(``to_object_ref_async``'s call alone, at sizes a round trip here cannot reach: a
sparse file of each ``--sizes`` and 20,000 small files; see ``bench.call_path``) and
``--codec`` (the durable tier's codec on real trained weights, no Ray; see
``bench.codec_path``) and ``--scale`` (N ranks on N nodes storing one shard each per
Train report round into replicated node storage: bytes per node per round, disks,
restore; see ``bench.scale_path``).
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import ray

from benchmarks.bench.call_path import format_call_table, run_call
from benchmarks.bench.codec_path import format_codec_table, run_codec
from benchmarks.bench.contenders import all_contenders, contender_function, default_contenders
from benchmarks.bench.data import (
    GB,
    LAYOUTS,
    clean_data_dir,
    first_difference,
    layout_plan,
    make_checkpoint,
    tree_digest,
)
from benchmarks.bench.dcp_path import format_dcp_table, run_dcp
from benchmarks.bench.drain_speed import format_drain_line
from benchmarks.bench.incremental_path import format_incremental_table, run_incremental
from benchmarks.bench.measure import predicted_peak_bytes, skip_reason
from benchmarks.bench.options import add_bench_options
from benchmarks.bench.readers import run_readers
from benchmarks.bench.report import (
    CONTENDER_METRICS,
    add_ratios,
    format_linearity,
    format_readers_table,
    format_table,
    format_train_table,
    linearity,
    pyplot,
    run_config,
    skipped,
    write_plot,
)
from benchmarks.bench.runner import prepare, progress, run_layout
from benchmarks.bench.scale_path import run_scale
from benchmarks.bench.scale_report import format_scale_table
from benchmarks.bench.session import drop_caches, machine_info, ray_session
from benchmarks.bench.tiered_path import format_tiered_table, run_tiered
from benchmarks.bench.train_path import run_train

__all__ = [
    "LAYOUTS",
    "add_arguments",
    "all_contenders",
    "clean_data_dir",
    "contender_function",
    "default_contenders",
    "first_difference",
    "layout_plan",
    "linearity",
    "main",
    "make_checkpoint",
    "predicted_peak_bytes",
    "run_bench",
    "run_call",
    "run_codec",
    "run_dcp",
    "run_incremental",
    "run_readers",
    "run_scale",
    "run_tiered",
    "run_train",
    "skip_reason",
    "skipped",
    "tree_digest",
]


def run_bench(opts: argparse.Namespace) -> dict[str, Any]:
    """Run every contender at every layout and size; returns the JSON report."""
    contenders = opts.contenders or default_contenders(opts.cross_node)
    setup = prepare(opts, 2 if opts.cross_node else 1)
    config, plan, sources, store = setup.config, setup.plan, setup.sources, setup.store_bytes
    machine = machine_info(opts.data_dir)
    results: list[dict[str, Any]] = []
    total = sum(len(s) for s in plan.values()) * len(contenders) * opts.repeats
    steps = (f"[{i}/{total}]" for i in range(1, total + 1))
    with ray_session(opts.cross_node, opts.num_cpus, store, log_to_driver=opts.progress) as how:
        store = ray.cluster_resources().get("object_store_memory", store)
        progress(f"{how}: object store {store / GB:.2f} GB in all; {total} measurements")
        if opts.drop_caches and not drop_caches():
            progress("--drop-caches: /proc/sys/vm/drop_caches is not writable; caches stay")
            opts.drop_caches = False
        for layout, sizes in plan.items():
            results += run_layout(contenders, layout, sizes, sources, config, opts, steps)
    add_ratios(results)
    per_node_store = store / (2 if opts.cross_node else 1)
    return {
        "mode": "contenders",
        "config": run_config(opts, config, contenders, per_node_store, CONTENDER_METRICS),
        "machine": machine,
        "results": results,
        "linearity": linearity(results),
    }


# -- command line ------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand: its flags, and ``main`` to run them."""
    add_bench_options(parser)
    parser.set_defaults(run=main)


def main(opts: argparse.Namespace) -> int:
    """Run the bench from parsed ``opts``: table and linearity on stdout, progress on
    stderr, JSON and PNG where asked."""
    if opts.small_files and "small" not in opts.layout:
        progress("--small-files applies only to --layout small")
        return 2
    if opts.plot:
        try:
            pyplot()  # fail now, not after an hour of measuring
        except ImportError as e:
            progress(str(e))
            return 2
    separate = (opts.train, opts.readers, opts.dcp, opts.incremental, opts.call, opts.tiered,
                opts.codec, opts.scale)  # fmt: skip
    if sum(map(bool, separate)) > 1:
        progress("--train, --readers, --dcp, --incremental, --call, --tiered, --codec and "
                 "--scale are separate runs: give one")  # fmt: skip
        return 2
    if any(separate) and (opts.contenders or opts.cross_node):
        progress("--contenders and --cross-node do not apply to --train, --readers, --dcp, "
                 "--incremental, --call, --tiered, --codec or --scale")  # fmt: skip
        return 2
    plotless = opts.dcp or opts.incremental or opts.call or opts.tiered or opts.codec or opts.scale
    if plotless and opts.plot:
        progress("--plot does not apply to --dcp, --incremental, --call, --tiered, --codec "
                 "or --scale")  # fmt: skip
        return 2
    if (opts.codec_model or opts.codec_level != 1) and not opts.codec:
        progress("--codec-model and --codec-level apply only to --codec")
        return 2
    if opts.scale:
        report = run_scale(opts)
        print(format_scale_table(report["results"]))
    elif opts.codec:
        report = run_codec(opts)
        print(format_codec_table(report["results"]))
    elif opts.tiered:
        report = run_tiered(opts)
        print(format_tiered_table(report["results"]))
        print(format_drain_line(report["drain"]))
    elif opts.call:
        report = run_call(opts)
        print(format_call_table(report["results"]))
    elif opts.incremental:
        report = run_incremental(opts)
        print(format_incremental_table(report["results"]))
    elif opts.dcp:
        report = run_dcp(opts)
        print(format_dcp_table(report["results"]))
    elif opts.readers:
        report = run_readers(opts)
        print(format_readers_table(report["results"]))
    elif opts.train:
        report = run_train(opts)
        print(format_train_table(report["results"]))
    else:
        report = run_bench(opts)
        print(format_table(report["results"]))
        print()
        print(format_linearity(report["linearity"]))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
        progress(f"wrote {opts.json}")
    if opts.plot:
        write_plot(report["results"], opts.plot)
        progress(f"wrote {opts.plot}")
    if opts.clean:
        removed = clean_data_dir(os.path.abspath(os.path.expanduser(opts.data_dir)))
        progress(f"--clean: removed {len(removed)} cached entries from {opts.data_dir}")
    failed = [r for r in report["results"] if r["status"] == "failed"]
    return 1 if failed else 0
