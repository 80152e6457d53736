"""Ray Train with a durable tier (moto's S3 server over HTTP) when the tier fails: a run
resumed on a new cluster whose latest checkpoint lost an object in the bucket, or had
one replaced, restores the newest checkpoint that is whole, byte for byte, never the
broken one, for a plain checkpoint and a torch DCP one alike; a run started while the
endpoint is down waits for it within the bound, then trains and drains."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray.cluster_utils import Cluster

import air_transfer
from air_transfer import StorageConfig
from tests.e2e.test_train_durable import _bucket_files, _checkpoint_dirs, _fit, _fit_dcp
from tests.support import shared_ray
from tests.support.cluster import shared_cluster
from tests.support.s3 import S3Server, bucket_server


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "runs")


def _restored(metrics: dict[str, Any]) -> bool:
    """Whether a report's metrics say it restored a checkpoint (a number, not NaN)."""
    step = metrics.get("restored_step")
    return isinstance(step, (int, float)) and step == step


def _flip(s3: S3Server, key: str, data: bytes) -> None:
    """The object ``key`` replaced by ``data`` with one bit flipped (same size)."""
    flipped = bytearray(data)
    flipped[len(flipped) // 2] ^= 1
    client: Any = s3.client()
    client.put_object(Bucket="runs", Key=key, Body=bytes(flipped))


def _drop(s3: S3Server, key: str) -> None:
    client: Any = s3.client()
    client.delete_object(Bucket="runs", Key=key)


def test_a_resumed_run_restores_the_newest_checkpoint_that_is_whole(
    cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    root = tmp_path / "node-storage"
    root.mkdir()
    uri = s3.uri("runs", "fallback")
    fs = air_transfer.storage_filesystem(root=str(root), durable=uri)
    first = _fit(root, fs, steps=3)
    reported = {m["step"]: m["digests"] for m in first.metrics_dataframe.to_dict("records")}
    saved = _fit_dcp(root, fs, steps=2)
    dcp_digests = {m["step"]: m["digest"] for _, m in saved.best_checkpoints}
    air_transfer.wait_durable(fs, timeout=120)
    bucket = _bucket_files(s3, "fallback")
    plain = _checkpoint_dirs({k: v for k, v in bucket.items() if "durable-run/" in k})
    dcp = _checkpoint_dirs({k: v for k, v in bucket.items() if "durable-dcp/" in k})
    assert len(plain) == 3 and len(dcp) == 2

    # The cluster goes; an object of each latest checkpoint goes from the bucket.
    shared_ray.release()
    shutil.rmtree(root)
    root.mkdir()
    for run, latest in (("durable-run", plain[-1]), ("durable-dcp", dcp[-1])):
        inside = sorted(
            rel
            for rel in bucket
            if f"{run}/{latest}/" in rel and not rel.endswith((".json", ".metadata"))
        )
        if run == "durable-run":
            _drop(s3, f"fallback/{inside[0]}")  # an object gone
        else:
            _flip(s3, f"fallback/{inside[0]}", bucket[inside[0]])  # a byte flipped
    shared_cluster()
    fs = air_transfer.storage_filesystem(root=str(root), durable=uri)
    second = _fit(root, fs, steps=4)
    rows = second.metrics_dataframe.to_dict("records")
    [resumed] = [m for m in rows if _restored(m)]  # the new cluster's first report
    assert resumed["step"] == 2  # step 2's checkpoint is not whole: step 1's restored
    assert resumed["restored_step"] == 1
    assert resumed["restored_digests"] == reported[1]  # byte for byte
    again = _fit_dcp(root, fs, steps=3)
    [restart] = [m for _, m in again.best_checkpoints if _restored(m)]
    assert restart["step"] == 1  # step 1's shard was replaced: step 0's, on both ranks
    assert restart["restored_step"] == 0
    assert restart["restored_digests"] == [dcp_digests[0]] * 2


def test_a_run_started_while_the_endpoint_is_down_waits_for_it_then_trains(
    cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    """Train's controller asks for the run's state, which only the tier could hold on
    a new cluster: the read waits for the endpoint (``durable_read_wait_s``) rather
    than fail the run at once or take "no answer" for "no run"."""
    root = tmp_path / "node-storage"
    root.mkdir()
    storage = StorageConfig(durable=s3.uri("runs", "start-down"), durable_read_wait_s=120.0)
    fs = air_transfer.storage_filesystem(root=str(root), storage=storage)
    s3.proxy.down()
    back = threading.Timer(5.0, s3.proxy.up)
    back.start()
    try:
        result = _fit(root, fs, steps=2)
    finally:
        back.join()
    assert result.metrics["step"] == 1
    air_transfer.wait_durable(fs, timeout=120)
    assert _checkpoint_dirs(_bucket_files(s3, "start-down"))
