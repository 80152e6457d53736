"""A Ray Train run on replicated node storage loses its storage node mid-run: the
run goes on, the next reports land on the live copies, a worker restart restores the
latest checkpoint from a copy byte for byte, and ``num_to_keep`` deletes apply to
every copy (the one repair re-makes included). On the replica tests' cluster, whose
removed nodes are known dead within seconds: a cluster of its own cost a start."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.train
from ray.cluster_utils import Cluster
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import TransferConfig, storage_filesystem
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from tests.support.checkpoints import MiB, digest_tree
from tests.support.cluster import node_ids
from tests.support.replicas import copies_identical, remove, workers
from tests.support.train_fns import train_loop
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

CONFIG = TransferConfig(chunk_bytes=MiB, window=4)


def test_the_storage_node_is_removed_mid_run(cluster4: Cluster, tmp_path: Path) -> None:
    """Storage on one worker node (copied to the head), the run's worker on another."""
    trainer_node, storage_node = workers()[:2]
    ids = node_ids()
    copies = tmp_path / "copies"
    fs = storage_filesystem(
        node=ids[storage_node],
        config=CONFIG,
        root=str(copies / ids[storage_node]),
        replicas=2,
        replica_nodes=(ids["head"],),
        replica_root=str(copies / "{node_id}"),
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, ReplicatedHandler)
    storage = f"{handler.root}/runs"
    (tmp_path / "pause").mkdir()
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={
            "size": 2 * MiB + 3,
            "steps": 4,
            "pause_after": 1,
            "pause_dir": str(tmp_path / "pause"),
            "fail_after": 2,
            "fail_marker": str(tmp_path / "failed"),
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=1, resources_per_worker={"CPU": 1, trainer_node: 0.01}
        ),
        run_config=ray.train.RunConfig(
            name="replicated",
            storage_path=storage,
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
            failure_config=ray.train.FailureConfig(max_failures=1),
        ),
    )
    outcome: dict[str, Any] = {}
    run = threading.Thread(target=lambda: outcome.update(result=trainer.fit()))
    run.start()
    eventually(lambda: (tmp_path / "pause" / "paused").exists(), "step 1 reported", 300)
    remove(cluster4, ids[storage_node])  # the storage node, with checkpoints 0 and 1
    (tmp_path / "pause" / "go").touch()
    run.join(600)
    result: ray.train.Result = outcome["result"]

    # Step 2 landed on the live copy, the restart restored it byte for byte from there,
    # and step 3 was reported after it.
    metrics = [m for _, m in result.best_checkpoints]
    assert [m["step"] for m in metrics] == [2, 3]
    assert metrics[1]["restored_step"] == 2
    assert metrics[1]["restored_digests"] == metrics[0]["digests"]
    # Every copy (the head's, and the one repair made on another node) holds the kept two.
    stored = copies_identical(handler, 2)
    run_dir = "runs/replicated/"
    names = sorted(
        p[len(run_dir) :]
        for p, body in stored.items()
        if p.startswith(run_dir + "checkpoint_") and body is None and p.count("/") == 2
    )
    kept = sorted(c.path.split("/")[-1] for c, _ in result.best_checkpoints)
    assert names == kept
    for checkpoint, m in result.best_checkpoints:
        restored = checkpoint.to_directory(str(tmp_path / checkpoint.path.split("/")[-1]))
        assert digest_tree(restored) == m["digests"]
