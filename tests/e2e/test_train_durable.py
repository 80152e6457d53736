"""Ray Train with node storage and a durable tier on a real S3 API (moto's server over
HTTP): the run's checkpoints and run state are drained into the bucket bit-identical,
``num_to_keep``'s deletes reach it, and a cluster started anew with empty disks
(a new GCS, new agents, the same ``root`` and ``durable``) resumes the run from the
bucket alone: Train finds its run state, ``get_checkpoint()`` restores the latest
checkpoint byte for byte, and the run goes on where it stopped, its new checkpoints
drained too. A torch DCP run into the same storage resumes the same way, each rank
loading its state from the bucket bit-identical. A worker fails right after a report
in the first run: the restart restores that report, as without a durable tier. The
bucket lost an object of the latest checkpoint, and had a shard of the latest DCP
checkpoint replaced, before the new cluster starts: each restart restores the newest
checkpoint that is whole, never the broken one. A run started while the endpoint is
down waits for it within the bound, then trains and drains."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
import ray.train
from ray.cluster_utils import Cluster
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

import air_transfer
from air_transfer import StorageConfig
from air_transfer.core.internal_names import is_internal
from tests.support import shared_ray
from tests.support.checkpoints import MiB
from tests.support.cluster import shared_cluster
from tests.support.dcp_fns import dcp_train_loop
from tests.support.s3 import S3Server, bucket_server
from tests.support.train_fns import train_loop

SIZE = 2 * MiB + 7
ON_NODE_A = {"CPU": 1, "node_a": 0.01}


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "runs")


def _fit(root: Path, fs: pafs.FileSystem, steps: int, **loop: Any) -> ray.train.Result:
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={"size": SIZE, "steps": steps, **loop},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker=ON_NODE_A),
        run_config=ray.train.RunConfig(
            name="durable-run",
            storage_path=str(root / "experiments"),
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=3),
            failure_config=ray.train.FailureConfig(max_failures=1),
        ),
    )
    return trainer.fit()


def _bucket_files(s3: S3Server, prefix: str) -> dict[str, bytes]:
    fs: Any = s3.filesystem()
    found = fs.get_file_info(pafs.FileSelector(f"runs/{prefix}", recursive=True))
    out = {}
    for info in found:
        rel = info.path[len(f"runs/{prefix}/") :]
        if info.type == pafs.FileType.File and not rel.startswith(".air-transfer/"):
            with fs.open_input_stream(info.path) as f:
                out[rel] = f.read()
    return out


def _fit_dcp(root: Path, fs: pafs.FileSystem, steps: int) -> ray.train.Result:
    """A torch DCP run (DDP, 2 ranks on the worker nodes) into the same storage."""
    from ray.train.torch import TorchTrainer

    return TorchTrainer(
        dcp_train_loop,
        train_loop_config={"steps": steps},
        scaling_config=ray.train.ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "trainer": 1}
        ),
        run_config=ray.train.RunConfig(
            name="durable-dcp", storage_path=str(root / "experiments"), storage_filesystem=fs
        ),
    ).fit()


def _checkpoint_dirs(files: dict[str, bytes]) -> list[str]:
    parts = (rel.split("/") for rel in files)
    return sorted({p[2] for p in parts if len(p) > 3 and p[2].startswith("checkpoint_")})


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


def _disk_files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not is_internal(p.name)
    }


def test_a_new_cluster_resumes_the_run_from_the_durable_tier_alone(
    cluster: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    root = tmp_path / "node-storage"
    root.mkdir()
    uri = s3.uri("runs", "resume")
    fs = air_transfer.storage_filesystem(root=str(root), durable=uri)
    marker = tmp_path / "failed-once"
    first = _fit(root, fs, steps=4, fail_after=1, fail_marker=str(marker))
    assert marker.exists()  # the worker failed right after its report of step 1
    assert first.metrics["step"] == 3
    rows = first.metrics_dataframe.to_dict("records")  # the kept reports: steps 1 to 3
    reported = {m["step"]: m["digests"] for m in rows}
    restarted = [m for m in rows if m["step"] == 2]
    assert restarted[0]["restored_step"] == 1  # the restart restored the last report
    assert restarted[0]["restored_digests"] == reported[1]

    saved = _fit_dcp(root, fs, steps=2)  # torch DCP too: each rank's shard, .metadata last
    dcp_digests = {m["step"]: m["digest"] for _, m in saved.best_checkpoints}

    air_transfer.wait_durable(fs, timeout=120)
    kept = _disk_files(root)
    assert _bucket_files(s3, "resume") == kept  # bit-identical, deletes applied
    checkpoints = _checkpoint_dirs({k: v for k, v in kept.items() if "durable-run/" in k})
    assert len(checkpoints) == 3  # num_to_keep=3: step 0's left the bucket too
    latest = first.checkpoint
    assert latest is not None
    assert air_transfer.storage_state(fs, latest.path).tier == "durable"

    # The cluster goes, and its disks with it; the bucket loses an object of the latest
    # checkpoint and has a shard of the latest DCP one replaced (a bit flipped); a new
    # cluster starts with the same settings: each restart restores the newest whole one.
    shared_ray.release()  # the whole cluster: its GCS, its agents, its drains
    shutil.rmtree(root)
    root.mkdir()
    dcp_dirs = _checkpoint_dirs({k: v for k, v in kept.items() if "durable-dcp/" in k})
    _drop(s3, f"resume/experiments/durable-run/{checkpoints[-1]}/model.bin")
    shard = f"experiments/durable-dcp/{dcp_dirs[-1]}/__0_0.distcp"
    _flip(s3, f"resume/{shard}", kept[shard])
    shared_cluster()
    fs = air_transfer.storage_filesystem(root=str(root), durable=uri)
    second = _fit(root, fs, steps=6)
    rows = second.metrics_dataframe.to_dict("records")
    [resumed] = [m for m in rows if _restored(m)]  # the new cluster's first report
    assert resumed["step"] == 3 and resumed["restored_step"] == 2  # step 3's is not whole
    assert resumed["restored_digests"] == reported[2]  # byte for byte, from the bucket
    assert second.metrics["step"] == 5

    dcp = _fit_dcp(root, fs, steps=3)  # each rank restores its shard from the bucket
    [restart] = [m for _, m in dcp.best_checkpoints if _restored(m)]
    assert restart["step"] == 1 and restart["restored_step"] == 0  # step 1's was replaced
    assert restart["restored_digests"] == [dcp_digests[0]] * 2  # bit-identical, both ranks

    air_transfer.wait_durable(fs, timeout=60)
    bucket = _bucket_files(s3, "resume")
    steps = _checkpoint_dirs({k: v for k, v in bucket.items() if "durable-run/" in k})
    # Steps 3 to 5 of the new run kept: the old ones, held only in the bucket, went there.
    assert len(steps) == 3 and not set(steps) & set(checkpoints)
    assert {rel: data for rel, data in bucket.items() if rel in _disk_files(root)} == (
        _disk_files(root)
    )


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
