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
  (S3FileSystem, prefix), incremental=True))``:
  a report returns once node storage holds it, the storage node's agent drains it to
  the bucket in the background (a file the bucket holds under another report's name
  is copied there, server-side).

Figures per contender: each report's blocking time in the worker (median, and its
ratio to ``ray-s3-sync``'s: the bar is 0.5x; ours includes waiting for Train to
register the report, at its controller's next poll, which Ray's own report does not
wait for), the time from the run's end until every
report is in the bucket (``wait_durable``; Ray's own are there when ``fit()``
returns), the bytes sent to the endpoint (Ray's path sends every report whole; ours,
what its drain uploaded), and the time to restore the last checkpoint
to a local directory: from the bucket for Ray's path, from node storage and, after
node storage lost it (as a new cluster's empty disks), from the bucket for ours.
Every restore is compared with its source.
"""

from __future__ import annotations

import argparse
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
CONTENDERS = (RAY_SYNC, RAY_ASYNC, TIERED)
BUCKET = "bench"
#: Checkpoints each run keeps (the older ones are deleted, from the bucket too): the
#: endpoint holds its objects in memory.
KEEP = 2


def run_contender(
    contender: str, sources: list[str], endpoint: S3Endpoint, data_dir: str, chunk: int
) -> dict[str, Any]:
    """One Train run of ``contender``; its row."""
    root = tempfile.mkdtemp(prefix=f"tiered-{contender}-", dir=data_dir)
    s3 = endpoint.filesystem()
    if contender == TIERED:
        storage = StorageConfig(durable=(s3, f"{BUCKET}/{contender}"), incremental=True)
        fs: pafs.FileSystem = air_transfer.storage_filesystem(
            config=TransferConfig(chunk_bytes=chunk), root=root, storage=storage
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
                "mode": "ASYNC" if contender == RAY_ASYNC else "SYNC",
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
        if contender == TIERED:
            air_transfer.wait_durable(fs)
        durable_s = time.perf_counter() - ended
        seconds: list[float] = ray.get(log.get.remote())
        sent, copied = _sent(contender, fs, sources)
        restores = _restores(contender, result, fs, root, sources[-1], data_dir)
    finally:
        ray.kill(log)
        shutil.rmtree(root, ignore_errors=True)
    verified = all(r is not None for r in restores.values())
    return {
        "contender": contender,
        "status": "ok" if verified else "failed",
        "reason": None if verified else "a restored checkpoint differs from its source",
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
    if contender != TIERED:
        return sum(_size(source) for source in sources), 0
    handler = node_storage_handler(fs)
    assert handler is not None
    status = handler.link.call(NodeDurable.durable_status, handler.root)
    return int(status.uploaded_bytes), int(status.copied_bytes)


def _size(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(directory, n)) for n in os.listdir(directory))


def _restores(
    contender: str, result: Any, fs: pafs.FileSystem, root: str, source: str, data_dir: str
) -> dict[str, float | None]:
    """Seconds to restore the last checkpoint to a local directory (None: it came back
    different): from the bucket for Ray's path; from node storage, then from the bucket
    alone (node storage's copy gone) for ours."""
    last = result.checkpoint
    out: dict[str, float | None] = {}
    tiers = ["node storage", "bucket"] if contender == TIERED else ["bucket"]
    for tier in tiers:
        if tier == "bucket" and contender == TIERED:
            shutil.rmtree(last.path)  # as a new cluster's empty disk: only the bucket holds it
        target = tempfile.mkdtemp(prefix="tiered-restore-", dir=data_dir)
        try:
            start = time.perf_counter()
            ray.train.Checkpoint(last.path, filesystem=fs).to_directory(target)
            seconds = time.perf_counter() - start
            out[tier] = seconds if tree_digest(target) == tree_digest(source) else None
        finally:
            shutil.rmtree(target, ignore_errors=True)
    return out


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
                     f"{REPORTS} reports of {total / MiB:.0f} MiB, 90% unchanged")  # fmt: skip
            for contender in CONTENDERS:
                progress(f"{contender}: {REPORTS} reports")
                rows.append(
                    run_contender(contender, sources, endpoint, opts.data_dir, opts.chunk_mib * MiB)
                )
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
            "bar": "air-tiered report blocking <= 0.5x ray-s3-sync's (median)",
        },
        "machine": machine_info(opts.data_dir),
        "results": rows,
        "drain": drain,
    }


def format_tiered_table(rows: list[dict[str, Any]]) -> str:
    """Per contender: median report time and its ratio to Ray's SYNC report, time until
    durable after the run, bytes sent to the endpoint, restore times, verified."""
    head = ("contender", "report s", "x sync", "durable +s", "sent GB", "restore s", "ok")
    lines = ["{:<13} {:>9} {:>7} {:>11} {:>8} {:>28} {:>3}".format(*head)]
    for r in rows:
        ratio = r["report_ratio_to_ray_sync"]
        restores = ", ".join(
            f"{tier} {'-' if s is None else f'{s:.2f}'}" for tier, s in r["restore_s"].items()
        )
        median = r["report_median_s"]
        lines.append(
            f"{r['contender']:<13} {'-' if median is None else f'{median:.2f}':>9} "
            f"{'-' if ratio is None else f'{ratio:.2f}':>7} "
            f"{r['durable_after_end_s']:>11.2f} {r['sent_bytes'] / 1e9:>8.3f} "
            f"{restores:>28} {'yes' if r['status'] == 'ok' else 'NO':>3}"
        )
    return "\n".join(lines)
