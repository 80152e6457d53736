"""Ray Train with incremental node storage on a mock cluster: a worker on ``node_a``
reports checkpoints that share a frozen file into ``storage_filesystem()`` on the
driver's node (through Train's hook, and through ``checkpoint_upload_fn``). Only the
changed bytes travel, the frozen file is stored once across the kept checkpoints,
Train's pruning (``num_to_keep``) never damages a kept one, and a failed worker
restores the last one bit-identical."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

import air_transfer
from air_transfer import TransferConfig, node_agent
from tests.support.checkpoints import digest_tree
from tests.support.cluster import node_ids
from tests.support.incremental_train import FROZEN, HEAD, frozen_loop

pytestmark = pytest.mark.usefixtures("cluster")
INCREMENTAL = TransferConfig(chunk_bytes=64 * 1024, window=2, incremental=True)
STEPS = 3


def fit(storage: Path, name: str, fs: Any, **loop_config: Any) -> ray.train.Result:
    trainer = DataParallelTrainer(
        frozen_loop,
        train_loop_config={"steps": STEPS, **loop_config},
        scaling_config=ray.train.ScalingConfig(
            num_workers=1, resources_per_worker={"CPU": 1, "node_a": 0.01}
        ),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            failure_config=ray.train.FailureConfig(max_failures=1),
        ),
    )
    return trainer.fit()


def sent() -> int:
    agent = node_agent(node_ids()["head"])
    return int(ray.get(agent.incremental_counters.remote())["bytes_sent"])


def assert_kept_whole(result: ray.train.Result) -> None:
    kept = result.best_checkpoints
    assert [m["step"] for _, m in kept] == [STEPS - 2, STEPS - 1]
    for checkpoint, metrics in kept:
        assert digest_tree(checkpoint.path) == metrics["digests"]
    (a, _), (b, _) = kept
    # Stored once: Train wrote the frozen file anew each step; one inode holds it.
    assert Path(a.path, "frozen.bin").stat().st_ino == Path(b.path, "frozen.bin").stat().st_ino


def test_reports_send_only_what_changed_and_restore_whole(tmp_path: Path) -> None:
    before = sent()
    marker = tmp_path / "failed-once"
    fs = air_transfer.storage_filesystem(config=INCREMENTAL)
    result = fit(tmp_path, "hooked", fs, fail_after=1, fail_marker=str(marker))
    assert marker.exists()
    assert_kept_whole(result)
    history = {m["step"]: m for _, m in result.best_checkpoints}
    assert history[STEPS - 2]["restored_digests"]  # resumed from step 1, read back whole
    # The first report whole, then only each step's new head (and state.json).
    assert sent() - before <= FROZEN + STEPS * (HEAD + 64)


def test_checkpoint_upload_fn_sends_only_what_changed(tmp_path: Path) -> None:
    before = sent()
    upload = functools.partial(air_transfer.checkpoint_upload_fn, config=INCREMENTAL)
    fs = air_transfer.storage_filesystem()
    result = fit(tmp_path, "upload", fs, upload_fn=upload)
    assert_kept_whole(result)
    assert sent() - before <= FROZEN + STEPS * (HEAD + 64)
