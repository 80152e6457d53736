"""``bench --tiered``: Ray Train reports into S3 the way Ray does it, beside node storage
with a durable tier on the same S3 endpoint.

A 2-node mock cluster (``--incremental``'s): the Train worker on the other node, node
storage on the driver's node. The endpoint is moto's S3 server, started for the run
on this machine (the same cores: compare ratios within one run). Each contender is
one Train run of ``REPORTS`` reports of one checkpoint (``--tiered-mib``) whose
bytes are 90% unchanged between reports (``--incremental``'s sources):

- ``ray-s3-sync``: ``RunConfig(storage_path=<bucket prefix>, storage_filesystem=
  pyarrow's S3FileSystem)``, ``report()`` blocking until the upload is done;
- ``ray-s3-async``: the same with ``checkpoint_upload_mode=ASYNC``;
- ``air-tiered``: ``storage_filesystem(root=..., storage=StorageConfig(durable=
  (S3FileSystem, prefix), incremental=True, replicas=--replicas))``:
  a ``SYNC`` report returns once node storage holds it (on every copy) and its round
  is committed, the storage node's agent drains it to the bucket in the background
  (a file the bucket holds under another report's name is copied there, server-side);
- ``air-tiered-async``: the same with ``checkpoint_upload_mode=ASYNC``.

Between reports the worker waits, off the clock, until Train has registered the
last one (``report_loop``'s ``spaced``), as a loop whose steps outlast Train's poll
finds it; ``--tiered-back-to-back`` drops that wait: every report made before the
controller's next poll then waits for it in Train's queue of one, whatever the path.

Figures per contender: each report's blocking time in the worker (median, and its
ratio to ``ray-s3-sync``'s: the bars are 0.35x, and 0.3 s at 32 MiB), the time from
the run's end until every report is in the bucket (``wait_durable``; Ray's own are
there when ``fit()`` returns), the bytes sent to the endpoint (Ray's path sends every
report whole; ours, what its drain uploaded), and the time to restore the last
checkpoint to a local directory: from the bucket for Ray's path, from node storage
and, after node storage lost it on every copy (as a new cluster's empty disks), from
the bucket for ours. Every restore is compared with its source.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import pyarrow.fs as pafs
import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

import air_transfer
from air_transfer import StorageConfig, TransferConfig
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.node_api import NodeDurable
from benchmarks.bench.data import tree_digest
from benchmarks.bench.drain_speed import drain_throughput
from benchmarks.bench.incremental_path import REPORTS, make_sources, new_time_log, report_loop
from benchmarks.bench.runner import progress
from benchmarks.bench.s3_endpoint import S3Endpoint
from benchmarks.bench.session import CROSS_NODES, machine_info, ray_session
from benchmarks.units import MiB

RAY_SYNC = "ray-s3-sync"
RAY_ASYNC = "ray-s3-async"
TIERED = "air-tiered"
TIERED_ASYNC = "air-tiered-async"
CONTENDERS = (RAY_SYNC, RAY_ASYNC, TIERED, TIERED_ASYNC)
OURS = (TIERED, TIERED_ASYNC)
BUCKET = "bench"
#: Checkpoints each run keeps (the older ones are deleted, from the bucket too): the
#: endpoint holds its objects in memory.
KEEP = 2
#: Train's controller polls its workers (and registers reports) this often (2 s default).
POLL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def run_contender(
    contender: str, sources: list[str], endpoint: S3Endpoint, opts: argparse.Namespace
) -> dict[str, Any]:
    """One Train run of ``contender``; its row."""
    root = tempfile.mkdtemp(prefix=f"tiered-{contender}-", dir=opts.data_dir)
    s3 = endpoint.filesystem()
    if contender in OURS:
        storage = StorageConfig(
            durable=(s3, f"{BUCKET}/{contender}"),
            incremental=True,
            replicas=opts.replicas,
            replica_root=None if opts.replicas == 1 else root + "-copies/{node_id}",
        )
        fs: pafs.FileSystem = air_transfer.storage_filesystem(
            config=TransferConfig(chunk_bytes=opts.chunk_mib * MiB), root=root, storage=storage
        )
        storage_path = os.path.join(root, "runs")
    else:
        fs, storage_path = s3, f"{BUCKET}/{contender}"
    log: Any = new_time_log()
    try:
        result = DataParallelTrainer(
            report_loop,
            train_loop_config={
                "sources": sources,
                "log": log,
                "mode": "ASYNC" if contender in (RAY_ASYNC, TIERED_ASYNC) else "SYNC",
                "spaced": not opts.tiered_back_to_back,
            },
            scaling_config=ray.train.ScalingConfig(
                num_workers=1, resources_per_worker={"CPU": 1, CROSS_NODES[1]: 0.01}
            ),
            run_config=ray.train.RunConfig(
                name=contender,
                storage_path=storage_path,
                storage_filesystem=fs,
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=KEEP),
            ),
        ).fit()
        ended = time.perf_counter()
        if contender in OURS:
            air_transfer.wait_durable(fs)
        durable_s = time.perf_counter() - ended
        seconds: list[float] = ray.get(log.get.remote())
        sent, copied = _sent(contender, fs, sources)
        restores, failure = _restores(contender, result, fs, root, sources[-1], opts.data_dir)
    finally:
        ray.kill(log)
        for where in (root, root + "-copies"):
            shutil.rmtree(where, ignore_errors=True)
    return {
        "contender": contender,
        "status": "ok" if failure is None else "failed",
        "reason": failure,
        "report_s": seconds,
        "report_median_s": statistics.median(seconds) if seconds else None,
        "durable_after_end_s": durable_s,
        "sent_bytes": sent,
        "copied_in_bucket_bytes": copied,
        "restore_s": restores,
    }


def _sent(contender: str, fs: pafs.FileSystem, sources: list[str]) -> tuple[int, int]:
    """Bytes sent to the endpoint, and bytes copied inside it (server-side, none of
    them sent): Ray's path sends every report's bytes (each report uploads its
    files); ours, what its drain uploaded, copying what the bucket held already."""
    if contender not in OURS:
        return sum(_size(source) for source in sources), 0
    handler = node_storage_handler(fs)
    assert handler is not None
    _, root, link = handler.drain_point()
    status = link.call(NodeDurable.durable_status, root)
    return int(status.uploaded_bytes), int(status.copied_bytes)


def _size(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def _restores(
    contender: str, result: Any, fs: pafs.FileSystem, root: str, source: str, data_dir: str
) -> tuple[dict[str, float | None], str | None]:
    """Seconds to restore the last checkpoint to a local directory (None: it came back
    different, or failed): from the bucket for Ray's path; from node storage, then from
    the bucket alone (node storage's copies gone) for ours; and the first failure."""
    last = result.checkpoint
    out: dict[str, float | None] = {}
    failure = None
    tiers = ["node storage", "bucket"] if contender in OURS else ["bucket"]
    for tier in tiers:
        if tier == "bucket" and contender in OURS:  # as a new cluster's empty disks:
            rel = os.path.relpath(last.path, root)  # only the bucket holds it
            for copy in [root, *glob.glob(os.path.join(root + "-copies", "*"))]:
                shutil.rmtree(os.path.join(copy, rel), ignore_errors=True)
        target = tempfile.mkdtemp(prefix="tiered-restore-", dir=data_dir)
        try:
            start = time.perf_counter()
            ray.train.Checkpoint(last.path, filesystem=fs).to_directory(target)
            seconds = time.perf_counter() - start
            same = tree_digest(target) == tree_digest(source)
            out[tier] = seconds if same else None
            failure = failure or (None if same else f"{tier}: the restore differs")
        except Exception as e:  # a row that says why, not a run that stops
            out[tier] = None
            failure = failure or f"{tier}: {type(e).__name__}: {e}"
        finally:
            shutil.rmtree(target, ignore_errors=True)
    return out, failure


def add_ratios(rows: list[dict[str, Any]]) -> None:
    """Each row's median report time as a multiple of ``ray-s3-sync``'s."""
    sync = next((r for r in rows if r["contender"] == RAY_SYNC and r["status"] == "ok"), None)
    for r in rows:
        ok = sync is not None and sync["report_median_s"] and r["report_median_s"] is not None
        r["report_ratio_to_ray_sync"] = (
            r["report_median_s"] / sync["report_median_s"] if ok else None  # type: ignore[index]
        )


def run_tiered(opts: argparse.Namespace) -> dict[str, Any]:
    """The ``--tiered`` run (see the module docstring); returns the JSON report."""
    opts.data_dir = os.path.abspath(os.path.expanduser(opts.data_dir))
    os.makedirs(opts.data_dir, exist_ok=True)
    total = opts.tiered_mib * MiB
    store = (opts.object_store_mb or max(512, 2 * opts.tiered_mib)) * MiB
    parent = tempfile.mkdtemp(prefix="tiered-src-", dir=opts.data_dir)
    rows = []
    try:
        sources = make_sources(parent, total)
        with S3Endpoint(opts.data_dir) as endpoint, ray_session(True, opts.num_cpus, store) as how:
            endpoint.create_bucket(BUCKET)
            progress(f"{how}: the worker on {CROSS_NODES[1]}, moto's S3 server on this machine; "
                     f"{REPORTS} reports of {total / MiB:.0f} MiB, 90% unchanged; node "
                     f"storage on {opts.replicas} node(s)")  # fmt: skip
            for contender in CONTENDERS:
                progress(f"{contender}: {REPORTS} reports")
                rows.append(run_contender(contender, sources, endpoint, opts))
            progress("the drain's throughput against copy_files with threads")
            drain = drain_throughput(endpoint, BUCKET, opts.data_dir, total, opts.chunk_mib * MiB)
    finally:
        shutil.rmtree(parent, ignore_errors=True)
    add_ratios(rows)
    return {
        "mode": "tiered",
        "config": {
            "checkpoint_mib": opts.tiered_mib,
            "reports": REPORTS,
            "unchanged_fraction": 0.9,
            "endpoint": "moto's S3 server on this machine",
            "replicas": opts.replicas,
            "spaced": not opts.tiered_back_to_back,
            "train_poll_s": float(os.environ.get(POLL_ENV, "2")),
            "bar": "air-tiered report blocking <= 0.35x ray-s3-sync's (median); <= 0.3 s at 32 MiB",
        },
        "machine": machine_info(opts.data_dir),
        "results": rows,
        "drain": drain,
    }


def format_tiered_table(rows: list[dict[str, Any]]) -> str:
    """Per contender: median report time and its ratio to Ray's SYNC report, time until
    durable after the run, bytes sent to the endpoint, restore times, verified."""
    head = ("contender", "report s", "x sync", "durable +s", "sent GB", "restore s", "ok")
    lines = ["{:<16} {:>9} {:>7} {:>11} {:>8} {:>28} {:>3}".format(*head)]
    for r in rows:
        ratio = r["report_ratio_to_ray_sync"]
        restores = ", ".join(
            f"{tier} {'-' if s is None else f'{s:.2f}'}" for tier, s in r["restore_s"].items()
        )
        median = r["report_median_s"]
        lines.append(
            f"{r['contender']:<16} {'-' if median is None else f'{median:.3f}':>9} "
            f"{'-' if ratio is None else f'{ratio:.2f}':>7} "
            f"{r['durable_after_end_s']:>11.2f} {r['sent_bytes'] / 1e9:>8.3f} "
            f"{restores:>28} {'yes' if r['status'] == 'ok' else 'NO':>3}"
        )
    return "\n".join(lines)
