"""``bench --tiered``'s drain throughput: the same files sent to the same S3 endpoint by
node storage's drain and by the floor available here, pyarrow's own
``copy_files(..., use_threads=True)``, in one run.

The files (``FILES`` of random bytes, ``--tiered-mib`` in all) lie in node storage's
root on the storage node's disk (node storage is plain files); the drain's time runs
from ``wait_durable``'s call, which wakes it, until every file is confirmed in the
bucket (a HEAD each: more than ``copy_files`` does). Figures: MB/s of each, and the
drain's as a multiple of the floor's (the bar: 0.8x).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

import pyarrow.fs as pafs

import air_transfer
from air_transfer import StorageConfig, TransferConfig
from benchmarks.bench.s3_endpoint import S3Endpoint
from benchmarks.units import MiB

#: Files of the measurement (several: both sides upload files at once).
FILES = 8


def drain_throughput(
    endpoint: S3Endpoint, bucket: str, data_dir: str, total: int, chunk: int
) -> dict[str, Any]:
    """The drain's and ``copy_files``'s MB/s on the same files, and their ratio."""
    source = tempfile.mkdtemp(prefix="drain-speed-src-", dir=data_dir)
    root = tempfile.mkdtemp(prefix="drain-speed-root-", dir=data_dir)
    try:
        each = max(1, total // FILES)
        for i in range(FILES):
            with open(os.path.join(source, f"shard-{i}.bin"), "wb") as f:
                f.write(os.urandom(each))
        nbytes = each * FILES
        s3 = endpoint.filesystem()
        start = time.perf_counter()
        pafs.copy_files(
            source, f"{bucket}/drain-speed/floor", source_filesystem=pafs.LocalFileSystem(),
            destination_filesystem=s3, use_threads=True,
        )  # fmt: skip
        floor_s = time.perf_counter() - start
        shutil.copytree(source, os.path.join(root, "run"), dirs_exist_ok=True)
        storage = StorageConfig(durable=(s3, f"{bucket}/drain-speed/drain"))
        fs = air_transfer.storage_filesystem(
            root=root, storage=storage, config=TransferConfig(chunk_bytes=chunk)
        )
        start = time.perf_counter()
        air_transfer.wait_durable(fs)
        drain_s = time.perf_counter() - start
    finally:
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(root, ignore_errors=True)
    floor, drain = nbytes / floor_s / 1e6, nbytes / drain_s / 1e6
    return {
        "bytes": nbytes,
        "files": FILES,
        "copy_files_threads_mb_s": floor,
        "drain_mb_s": drain,
        "drain_ratio_to_copy_files": drain / floor,
        "bar": "drain >= 0.8x copy_files(use_threads=True), same files, same endpoint",
    }


def format_drain_line(row: dict[str, Any]) -> str:
    return (
        f"drain throughput: {row['drain_mb_s']:.0f} MB/s against copy_files with threads "
        f"{row['copy_files_threads_mb_s']:.0f} MB/s ({row['drain_ratio_to_copy_files']:.2f}x), "
        f"{row['files']} files, {row['bytes'] / MiB:.0f} MiB"
    )
