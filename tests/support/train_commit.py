"""A two-rank Train run whose ranks each store a shard of every step's checkpoint, a
rank killed (SIGKILL) right after its report returns or failing before it reports,
and a user callback that holds Train's controller meanwhile: what the tests of
committed report rounds (``tests/e2e/test_train_commit.py``) run.

Holding the controller in its ``after_report`` of step ``hold_at`` (its event loop
blocked) makes the order deterministic: no poll takes a worker's next report, and
no registration happens, until the callback lets go, once the killed rank's report
of step ``kill_after`` returned and its process is gone. A report that waited for
Train's registration never returns while the controller is held: the callback then
lets go at its deadline and says so.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray.train
from ray.train.v2.api.callback import UserCallback
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from tests.support.checkpoints import MiB, digest_tree
from tests.support.waiting import eventually

NUM_TO_KEEP = 2
STEPS = 3
SHARD = 2 * MiB
#: How long the held controller waits for the killed rank's report at most: a report
#: that returns without Train takes well under a second; one waiting for Train never.
HOLD_S = 60


class HoldController(UserCallback):
    """Holds Train's controller in its ``after_report`` of step ``step`` until the
    rank killed after step ``step + 1``'s report is gone, or ``HOLD_S``; writes
    ``released`` or ``timed out`` to ``<out>/held``."""

    def __init__(self, out: str, step: int) -> None:
        self.out, self.step = out, step

    def after_report(
        self, run_context: Any, metrics: list[dict[str, Any]], checkpoint: Any
    ) -> None:
        held = Path(self.out, "held")
        if metrics[0]["step"] != self.step or held.exists():
            return
        pid_file = Path(self.out, "killed-pid")

        def gone() -> bool:
            return pid_file.exists() and not Path("/proc", pid_file.read_text()).exists()

        try:
            eventually(gone, "the killed rank's report", timeout_s=HOLD_S)
            held.write_text("released")
        except AssertionError:
            held.write_text("timed out")


def sharded_loop(config: dict[str, Any]) -> None:
    """Each step every rank stores its shard (rank 0 also ``state.json``) into the
    step's checkpoint and reports it (``SYNC``). In the first attempt each rank notes
    each report that returned (``<out>/returned/<step>-<rank>``: its digests); rank
    ``kill_rank`` kills its process right after its report of step ``kill_after``,
    and the upload of rank ``fail_rank``'s report of step ``fail_mid`` fails once
    rank 0's shard of it is stored (``failing_upload``). Every report says which step
    the run resumed from and what it read back."""
    out = Path(config["out"])
    rank = ray.train.get_context().get_world_rank()
    checkpoint = ray.train.get_checkpoint()
    first = checkpoint is None
    start, restored = 0, {}
    if checkpoint is not None:
        d = checkpoint.to_directory(tempfile.mkdtemp(prefix="restore-"))
        start = json.loads((Path(d) / "state.json").read_text())["step"] + 1
        restored = {"restored_step": start - 1, "restored_digests": digest_tree(d)}
        shutil.rmtree(d)
    for step in range(start, STEPS):
        failing = first and rank == config.get("fail_rank") and step == config.get("fail_mid")
        d = Path(tempfile.mkdtemp(prefix=f"step{step}-{rank}-"))
        (d / f"shard-{rank}.bin").write_bytes(os.urandom(SHARD))
        if rank == 0:
            (d / "state.json").write_text(json.dumps({"step": step}))
        digests = digest_tree(d)
        ray.train.report(
            {"step": step, "rank": rank, **restored},
            checkpoint=ray.train.Checkpoint.from_directory(str(d)),
            checkpoint_upload_fn=failing_upload if failing else None,
        )
        shutil.rmtree(d)
        restored = {}
        if first:
            (out / "returned" / f"{step}-{rank}").write_text(json.dumps(digests))
        if first and rank == config.get("kill_rank") and step == config.get("kill_after"):
            (out / "killed-pid").write_text(str(os.getpid()))
            os.kill(os.getpid(), signal.SIGKILL)


def failing_upload(checkpoint: ray.train.Checkpoint, name: str) -> ray.train.Checkpoint:
    """A report's upload (``checkpoint_upload_fn``) that fails once rank 0's shard of
    the same checkpoint is stored: rank 0 is then past its upload."""
    storage = ray.train.get_context().get_storage()
    shard = f"{storage.build_checkpoint_path_from_name(name)}/shard-0.bin"
    fs = storage.storage_filesystem
    eventually(
        lambda: fs.get_file_info(shard).type != pafs.FileType.NotFound,
        "rank 0's shard stored",
        timeout_s=120,
    )
    raise RuntimeError(f"this rank's upload of {name} fails")


def fit(
    out: Path,
    fs: pafs.FileSystem,
    storage: str,
    hold_at: int | None,
    workers: int = 2,
    **loop: Any,
) -> ray.train.Result:
    """``sharded_loop`` on ``workers`` workers (the nodes offering ``trainer``),
    storing into ``fs`` under ``storage`` (run ``run``), one failure allowed; the
    controller held at step ``hold_at`` (None: never)."""
    (out / "returned").mkdir(parents=True)
    callbacks = [] if hold_at is None else [HoldController(str(out), hold_at)]
    trainer = DataParallelTrainer(
        sharded_loop,
        train_loop_config={"out": str(out), **loop},
        scaling_config=ray.train.ScalingConfig(
            num_workers=workers, resources_per_worker={"CPU": 1, "trainer": 1}
        ),
        run_config=ray.train.RunConfig(
            name="run",
            storage_path=storage,
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=NUM_TO_KEEP),
            failure_config=ray.train.FailureConfig(max_failures=1),
            callbacks=callbacks,
        ),
    )
    return trainer.fit()


def returned(out: Path, step: int, workers: int = 2) -> dict[str, str] | None:
    """The digests of step ``step``'s checkpoint (every rank's shard), if every rank's
    report of it returned in the first attempt."""
    notes = [out / "returned" / f"{step}-{rank}" for rank in range(workers)]
    if not all(n.exists() for n in notes):
        return None
    return {k: v for n in notes for k, v in json.loads(n.read_text()).items()}


def resumed_from(result: ray.train.Result) -> tuple[int, dict[str, str]]:
    """The step the restarted group restored, and the digests it read back."""
    for _, metrics in sorted(result.best_checkpoints, key=lambda c: c[1]["step"]):
        if "restored_step" in metrics:
            return metrics["restored_step"], metrics["restored_digests"]
    raise AssertionError(f"no step says what it restored: {result.best_checkpoints}")


def kept_alone(result: ray.train.Result, run_dir: Path) -> None:
    """Storage holds the checkpoints Train kept and nothing else (no orphan)."""
    on_disk = sorted(p.name for p in run_dir.iterdir() if p.is_dir())
    kept = sorted(Path(c.path).name for c, _ in result.best_checkpoints)
    assert len(kept) == NUM_TO_KEEP and on_disk == kept, (on_disk, kept)
