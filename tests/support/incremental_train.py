"""A Ray Train loop whose checkpoints share most of their bytes: each step writes
``frozen.bin`` anew with the same bytes (a frozen layer), ``head.bin`` with new ones
and a small ``state.json``, reports it with its files' digests, and on resume
reports what it restored."""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import TransferConfig, node_agent
from tests.support.checkpoints import digest_tree
from tests.support.cluster import node_ids

FROZEN = 3 * 64 * 1024
HEAD = 64 * 1024
STEPS = 3
INCREMENTAL = TransferConfig(chunk_bytes=64 * 1024, window=2, incremental=True)
#: What ``STEPS`` reports may send at most: the first whole, then each step's head.
MOST_SENT = FROZEN + STEPS * (HEAD + 64)


def frozen_loop(config: dict[str, Any]) -> None:
    """``config``: ``steps``, optionally ``upload_fn``, ``fail_after``/``fail_marker``."""
    checkpoint, start, restored = ray.train.get_checkpoint(), 0, {}
    if checkpoint is not None:
        d = checkpoint.to_directory(tempfile.mkdtemp(prefix="restore-"))
        start = json.loads((Path(d) / "state.json").read_text())["step"] + 1
        restored = {"restored_step": start - 1, "restored_digests": digest_tree(d)}
        shutil.rmtree(d)
    for step in range(start, config["steps"]):
        d = Path(tempfile.mkdtemp(prefix=f"frozen{step}-"))
        (d / "frozen.bin").write_bytes(random.Random(7).randbytes(FROZEN))
        (d / "head.bin").write_bytes(os.urandom(HEAD))
        (d / "state.json").write_text(json.dumps({"step": step}))
        metrics = {"step": step, "digests": digest_tree(d), **restored}
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(str(d)),
            checkpoint_upload_fn=config.get("upload_fn"),
        )
        shutil.rmtree(d)
        restored = {}
        marker = config.get("fail_marker")
        if config.get("fail_after") == step and marker and not os.path.exists(marker):
            Path(marker).write_text("failed once")
            raise RuntimeError(f"injected failure after step {step}")


def fit_frozen(storage: Path, name: str, fs: Any, **loop_config: Any) -> ray.train.Result:
    """One worker on ``node_a`` running ``frozen_loop`` for ``STEPS`` steps, two
    checkpoints kept, one failure allowed."""
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


def sent_to_head() -> int:
    """Bytes the driver node's agent received in incremental stores so far."""
    agent = node_agent(node_ids()["head"])
    return int(ray.get(agent.incremental_counters.remote())["bytes_sent"])


def assert_kept_whole(result: ray.train.Result) -> None:
    """The two checkpoints Train kept hold what was reported, the frozen file
    stored once (Train wrote it anew each step; one inode holds it)."""
    kept = result.best_checkpoints
    assert [m["step"] for _, m in kept] == [STEPS - 2, STEPS - 1]
    for checkpoint, metrics in kept:
        assert digest_tree(checkpoint.path) == metrics["digests"]
    (a, _), (b, _) = kept
    assert Path(a.path, "frozen.bin").stat().st_ino == Path(b.path, "frozen.bin").stat().st_ino
