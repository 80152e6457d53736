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

from tests.support.checkpoints import digest_tree

FROZEN = 3 * 64 * 1024
HEAD = 64 * 1024


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
