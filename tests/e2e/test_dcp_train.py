"""Ray Train's TorchTrainer with torch's own checkpointing through node storage, on
a mock cluster: 2 DDP workers on the two nodes that are not the driver's, the run's
storage on the driver's node (``storage_filesystem()``).

DCP through ``air_transfer.dcp``: every step's checkpoint is saved by both ranks
straight into the run's storage and reported in place; a planned failure of both
workers; the restarted workers resume from the latest checkpoint with the model and
the optimizer state bit-identical to an uninterrupted run's at that step, and end
where it ended, after a rank's failed staging too; a rank failing mid-save leaves
nothing Train does not track. And
``torch.save`` checkpoints, reported the usual way, restore on every rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray.train
from ray.cluster_utils import Cluster
from ray.train.torch import TorchTrainer

import air_transfer
from air_transfer import TransferConfig
from tests.support.cluster import node_ids, shared_cluster
from tests.support.dcp_fns import MiB, dcp_train_loop, torch_save_loop

CONFIG = TransferConfig(chunk_bytes=MiB, window=4)
STEPS = 4


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head (driver, storage) plus nodes a and b, which alone offer ``trainer``: the
    cluster the suite shares."""
    yield shared_cluster()


@pytest.fixture(scope="module")
def fs(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> pafs.FileSystem:
    """Node storage on the head node, rooted at the session's temporary directory."""
    return air_transfer.storage_filesystem(config=CONFIG, root=str(tmp_path_factory.getbasetemp()))


def fit(
    loop: Any,
    storage: Path,
    name: str,
    fs: pafs.FileSystem,
    keep: int | None = None,
    failures: int = 1,
    **config: Any,
) -> ray.train.Result:
    trainer = TorchTrainer(
        loop,
        train_loop_config={"steps": STEPS, **config},
        scaling_config=ray.train.ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "trainer": 1}
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            storage_filesystem=fs,
            failure_config=ray.train.FailureConfig(max_failures=failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=keep),
        ),
    )
    return trainer.fit()


def history(result: ray.train.Result) -> dict[int, dict[str, Any]]:
    return {m["step"]: m for _, m in result.best_checkpoints}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory, fs: pafs.FileSystem) -> Any:
    """The reference: DCP saved each step (synchronously), no failure."""
    storage = tmp_path_factory.mktemp("storage")
    return fit(dcp_train_loop, storage, "uninterrupted", fs), storage


def test_dcp_checkpoints_land_in_the_runs_storage_once(
    uninterrupted: tuple[ray.train.Result, Path],
) -> None:
    """Each reported checkpoint is the directory both ranks saved into, on the
    driver's node: the two ranks' files and the metadata, the replicated DDP state
    stored once (split between the ranks by DCP), nothing else."""
    result, storage = uninterrupted
    assert sorted(history(result)) == list(range(STEPS))
    ids = node_ids()
    for checkpoint, metrics in result.best_checkpoints:
        assert metrics["node"] in (ids["node_a"], ids["node_b"])
        path = Path(checkpoint.path)
        assert path.parent == storage / "uninterrupted"
        files = {p.name: p.stat().st_size for p in path.iterdir()}
        assert set(files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
        shards = files["__0_0.distcp"] + files["__1_0.distcp"]
        assert 6 * MiB < shards < 6.5 * MiB  # weights + Adam's two moments, once
        assert min(files["__0_0.distcp"], files["__1_0.distcp"]) > 2 * MiB


def test_a_failed_run_resumes_bit_identical_with_async_saves(
    uninterrupted: tuple[ray.train.Result, Path], tmp_path: Path, fs: pafs.FileSystem
) -> None:
    """Async saves; both workers fail after step 1's checkpoint is committed; the
    restarted ones load it (each rank from the driver's node) and train on: the
    restored model and optimizer state equal the uninterrupted run's at step 1 on
    every rank, and every later step equals it too. At step 3 rank 1's staging
    fails (a value that cannot be copied) while Train agrees on the report: its
    report raises, the round ends, and the run resumes from step 2 as well, storage
    holding only the checkpoints Train tracks."""
    reference = history(uninterrupted[0])
    marker = tmp_path / "failed-once"
    result = fit(
        dcp_train_loop,
        tmp_path,
        "resumed",
        fs,
        failures=2,
        upload_mode=ray.train.CheckpointUploadMode.ASYNC,
        fail_after=1,
        fail_in_staging=3,
        fail_marker=str(marker),
    )
    assert Path(f"{marker}.0").exists() and Path(f"{marker}.1").exists()
    assert Path(f"{marker}.staging").exists()
    assert result.error is None
    resumed = history(result)
    assert sorted(resumed) == list(range(STEPS))
    for checkpoint, _ in result.best_checkpoints:  # each async save was complete when reported
        names = {p.name for p in Path(checkpoint.path).iterdir()}
        assert names == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert resumed[2]["restored_step"] == 1 and resumed[3]["restored_step"] == 2
    assert resumed[2]["restored_digests"] == [reference[1]["digest"]] * 2
    assert resumed[3]["restored_digests"] == [reference[2]["digest"]] * 2
    for step in range(STEPS):
        assert resumed[step]["digest"] == reference[step]["digest"], f"step {step} differs"
    stored = {p for p in (tmp_path / "resumed").iterdir() if p.is_dir()}
    assert stored == {Path(c.path) for c, _ in result.best_checkpoints}


def test_a_rank_failing_mid_save_leaves_only_what_train_tracks_in_storage(
    tmp_path: Path, fs: pafs.FileSystem
) -> None:
    """Rank 1's save of step 1 fails midway (rank 0's shard is stored, no metadata);
    Train stops the round and resumes from step 0. The failed save's directory
    stayed in storage, tracked by nobody, past ``num_to_keep``; now storage holds
    exactly the checkpoints Train keeps."""
    marker = tmp_path / "failed-once"
    result = fit(
        dcp_train_loop,
        tmp_path,
        "failed-save",
        fs,
        keep=2,
        steps=3,
        fail_in_save=1,
        fail_marker=str(marker),
    )
    assert Path(f"{marker}.save").exists()
    steps = history(result)
    assert sorted(steps) == [1, 2] and steps[1]["restored_step"] == 0
    stored = {p for p in (tmp_path / "failed-save").iterdir() if p.is_dir()}
    assert stored == {Path(c.path) for c, _ in result.best_checkpoints}


def test_torch_save_checkpoints_restore_on_every_rank(tmp_path: Path, fs: pafs.FileSystem) -> None:
    """Rank 0 ``torch.save``s ``model.pt`` into a directory and reports it, as Ray's
    docs show; after a failure both ranks restore it from the driver's node."""
    marker = tmp_path / "failed-once"
    result = fit(
        torch_save_loop, tmp_path, "torch-save", fs, steps=2, fail_after=0, fail_marker=str(marker)
    )
    steps = history(result)
    assert sorted(steps) == [0, 1]
    assert steps[1]["restored_step"] == 0
    assert steps[1]["restored_digests"] == [steps[0]["digest"]] * 2
