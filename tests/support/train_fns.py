"""Training functions for the Ray Train / Tune tests: each step writes a checkpoint
(one big file and a few small ones, different bytes per step), reports it with the
digests of its files, and on resume reports what it restored."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import ray
import ray.train
import ray.tune

from tests.support.checkpoints import digest_tree, make_checkpoint


def step_checkpoint(step: int, size: int) -> tuple[str, dict[str, str]]:
    d = tempfile.mkdtemp(prefix=f"step{step}-")
    make_checkpoint(Path(d), size, seed=step)
    (Path(d) / "state.json").write_text(json.dumps({"step": step}))
    return d, digest_tree(d)


def _restored(checkpoint: Any) -> tuple[int, dict[str, Any]]:
    """The step to start from and what to report about the restored checkpoint."""
    if checkpoint is None:
        return 0, {}
    # A directory of this rank's own: on a mock cluster every "node" shares one disk,
    # and Ray's default restore path (``as_directory``) is the same for both ranks, so
    # one rank could find it locked by the other (``TempFileLock(timeout=0)``).
    d = checkpoint.to_directory(tempfile.mkdtemp(prefix="restore-"))
    step = json.loads((Path(d) / "state.json").read_text())["step"]
    digests = digest_tree(d)
    shutil.rmtree(d, ignore_errors=True)
    info = {"restored_step": step, "restored_digests": digests, "restored_path": checkpoint.path}
    return step + 1, info


def _fail_once(config: dict[str, Any], step: int) -> None:
    marker = config.get("fail_marker")
    if config.get("fail_after") == step and marker and not os.path.exists(marker):
        Path(marker).write_text("failed once")
        raise RuntimeError(f"injected failure after step {step}")


def train_loop(config: dict[str, Any]) -> None:
    """A Ray Train worker loop: ``config`` has ``steps``, ``size``, ``mode`` ("SYNC" or
    "ASYNC"), optionally ``fail_after``/``fail_marker`` and ``upload_fn``."""
    start, restored = _restored(ray.train.get_checkpoint())
    node = ray.get_runtime_context().get_node_id()
    mode = ray.train.CheckpointUploadMode[config.get("mode", "SYNC")]
    for step in range(start, config["steps"]):
        d, digests = step_checkpoint(step, config["size"])
        metrics = {"step": step, "node": node, "digests": digests, **restored}
        ray.train.report(
            metrics,
            checkpoint=ray.train.Checkpoint.from_directory(d),
            checkpoint_upload_mode=mode,
            checkpoint_upload_fn=config.get("upload_fn"),
        )
        if mode == ray.train.CheckpointUploadMode.SYNC:
            shutil.rmtree(d)
        restored = {}
        _pause(config, step)
        _fail_once(config, step)


def _pause(config: dict[str, Any], step: int) -> None:
    """After step ``pause_after`` (first attempt only): say so in ``pause_dir`` and
    wait there until the test says go (the test changes the cluster meanwhile)."""
    where = config.get("pause_dir")
    if config.get("pause_after") != step or not where or os.path.exists(f"{where}/go"):
        return
    from tests.support.waiting import eventually

    Path(where, "paused").touch()
    eventually(lambda: os.path.exists(f"{where}/go"), "the test's go", timeout_s=300)


def tune_trainable(config: dict[str, Any]) -> None:
    """The same loop as a Ray Tune function trainable."""
    start, restored = _restored(ray.tune.get_checkpoint())
    node = ray.get_runtime_context().get_node_id()
    for step in range(start, config["steps"]):
        d, digests = step_checkpoint(step, config["size"])
        metrics = {"step": step, "node": node, "digests": digests, **restored}
        ray.tune.report(metrics, checkpoint=ray.tune.Checkpoint.from_directory(d))
        shutil.rmtree(d)
        restored = {}
        _fail_once(config, step)


def ranked_loop(config: dict[str, Any]) -> None:
    """A data-parallel loop: rank 0 reports a checkpoint each step, the other ranks
    metrics only, and rank ``fail_rank`` raises once right after its report of step
    ``fail_after``. Every report says which step the run resumed from; in the first
    attempt rank 0 leaves a file in ``returned_dir`` for each report that returned
    (with ``mode="ASYNC"``, once Train has registered it), holding its digests."""
    checkpoint = ray.train.get_checkpoint()
    start, restored = _restored(checkpoint)
    rank = ray.train.get_context().get_world_rank()
    mode = ray.train.CheckpointUploadMode[config.get("mode", "SYNC")]
    for step in range(start, config["steps"]):
        metrics = {
            "step": step,
            "restored_step": restored.get("restored_step"),
            "restored_digests": restored.get("restored_digests"),
        }
        if rank == 0:
            d, digests = step_checkpoint(step, config["size"])
            ray.train.report(
                {**metrics, "digests": digests},
                checkpoint=ray.train.Checkpoint.from_directory(d),
                checkpoint_upload_mode=mode,
            )
            if mode == ray.train.CheckpointUploadMode.SYNC:
                shutil.rmtree(d)
            else:  # Ray deletes the directory once uploaded
                committed = ray.train.CheckpointConsistencyMode.COMMITTED
                ray.train.get_all_reported_checkpoints(consistency_mode=committed)
            if checkpoint is None:
                Path(config["returned_dir"], str(step)).write_text(json.dumps(digests))
        else:
            ray.train.report(metrics)
        if rank == config["fail_rank"]:
            _fail_once(config, step)


def report_directory(config: dict[str, Any]) -> None:
    """Report the directory ``config["source"]`` as it is, once."""
    ray.train.report({}, checkpoint=ray.train.Checkpoint.from_directory(config["source"]))
