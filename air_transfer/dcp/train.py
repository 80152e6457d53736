"""The Ray Train recipe in one call each way: ``report`` (``ray.train.report``'s
arguments, with the state dict for the checkpoint) saves this report's checkpoint
from every rank straight into the run's storage and reports it in-band;
``load`` loads this rank's part of the latest one in place. Errors are the rank's own
(``ChecksumError``, ``PermissionError``), not DCP's ``CheckpointException``.
"""

from __future__ import annotations

import contextlib
import copy
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import ray
import ray.train
import ray.train.collective
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointUploadMode, ValidationTaskConfig
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.planner import LoadPlanner, SavePlanner
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.stateful import Stateful

from air_transfer.cluster._ray import train_reports_made
from air_transfer.core.keywords import positional_at_most
from air_transfer.core.threads import pool
from air_transfer.dcp.reader import NodeStorageReader
from air_transfer.dcp.storage import report_writer

T = TypeVar("T")


def _unwrapped(call: Callable[[], T]) -> T:
    """``call()``, raising the error a rank raised (this rank's if it failed) rather
    than DCP's CheckpointException, a BaseException that ``except Exception`` misses."""
    try:
        return call()
    except CheckpointException as e:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        failed, _ = e.failures.get(rank) or next(iter(e.failures.values()))
        if not isinstance(failed, Exception):
            raise
        raise copy.copy(failed) from e


# -- the Ray Train recipe ----------------------------------------------------------------
_lock = threading.Lock()
_pending: Future[None] | None = None  # this worker's async save still running
_async_group: dist.ProcessGroup | None = None  # where async saves run their collectives
_reporting: ThreadPoolExecutor | None = None  # where async reports call Train's (_reporter)


@positional_at_most(
    1,
    "air_transfer.dcp.report takes ray.train.report's order: report(metrics, "
    "state_dict=state_dict, ...), the metrics first and the state dict by keyword "
    "(the state dict used to come first)",
)
def report(
    metrics: dict[str, Any],
    *,
    state_dict: dict[str, Any],
    planner: SavePlanner | None = None,
    checkpoint_dir_name: str | None = None,
    checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
    validation: bool | ValidationTaskConfig = False,
    async_save: bool | None = None,
) -> None:
    """``ray.train.report(metrics, checkpoint=...)`` for a torch DCP checkpoint: in a
    Ray Train worker (every rank calls it), DCP-save ``state_dict`` straight into
    this report's checkpoint directory of the run's storage and report it with
    ``metrics``: no local copy, no upload.

    ``planner``: DCP's ``SavePlanner`` (default: DCP's own), as ``dcp.save`` takes it.
    ``checkpoint_dir_name`` and ``validation`` are passed on to ``ray.train.report``.
    ``checkpoint_upload_mode`` says when the call returns, as for Ray: ``SYNC`` once
    the checkpoint is saved and reported; ``ASYNC`` once the state dict is staged
    (copied to CPU) and Train has named the checkpoint, the two at once (Train's
    agreement on a thread beside the staging, so the call blocks about as long as
    the staging alone), the save going on in Train's upload thread on a process
    group of its own (training's collectives go on meanwhile) and the report
    following once it is complete; a later save waits for this one first
    (``wait_for_pending_save``).
    The async save is Train's ``checkpoint_upload_fn``: it writes into the directory
    Train names, after the one agreement on that name every report makes. A staging
    that fails raises here; once Train has agreed, the save fails with it too, and
    Train ends the round as for any failed async upload.
    ``NO_UPLOAD`` is refused: the save is the upload.

    Args:
        metrics: As for ``ray.train.report``.
        state_dict: What to save, as for ``dcp.save`` (by keyword).
        planner: DCP's ``SavePlanner`` (default: DCP's own), as ``dcp.save`` takes it.
        checkpoint_dir_name: Passed on to ``ray.train.report``.
        checkpoint_upload_mode: ``SYNC`` or ``ASYNC``, as above.
        validation: Passed on to ``ray.train.report``.
        async_save: ``True`` is the former spelling of ``ASYNC`` (deprecated).

    Raises:
        ValueError: ``checkpoint_upload_mode`` is ``NO_UPLOAD``.
        TypeError: The old order, ``report(state_dict, metrics)`` (the message says
            the new one).
    """
    mode = _upload_mode(checkpoint_upload_mode, async_save)
    wait_for_pending_save()
    storage = ray.train.get_context().get_storage()
    worker = ray.get_runtime_context().get_actor_id() or ""
    this = _Report(storage, worker, planner, metrics, checkpoint_dir_name, validation)
    (_report_sync if mode == CheckpointUploadMode.SYNC else _report_async)(this, state_dict)


@dataclass(frozen=True)
class _Report:
    """One report of Train worker ``worker``: what ``ray.train.report`` is given
    (``metrics``, ``checkpoint_dir_name``, ``validation``) and how its state dict
    is DCP-saved into a checkpoint directory of the run's ``storage`` (Train's
    ``StorageContext``), with ``planner``; either mode reports it."""

    storage: Any
    worker: str
    planner: SavePlanner | None
    metrics: dict[str, Any]
    checkpoint_dir_name: str | None
    validation: bool | ValidationTaskConfig

    def save(
        self,
        name: str,
        state: dict[str, Any],
        group: dist.ProcessGroup | None = None,
        staged: bool = False,
    ) -> Checkpoint:
        """Save ``state`` into the run's checkpoint directory ``name`` (on the
        collectives of ``group``; ``staged``: on CPU already)."""
        storage = self.storage
        path = storage.build_checkpoint_path_from_name(name)
        writer = report_writer(path, storage.storage_filesystem, self.worker)
        if staged:  # on CPU already: no copy-ahead (and no CUDA stream in Train's thread)
            writer.per_thread_copy_ahead = 0
        _unwrapped(
            lambda: state_dict_saver.save(
                state, storage_writer=writer, planner=self.planner, process_group=group
            )
        )
        return Checkpoint(path, filesystem=storage.storage_filesystem)


def _report_sync(report: _Report, state_dict: dict[str, Any]) -> None:
    """``SYNC``: saved before Train's report is called, so that a save that fails (on
    every rank: DCP gathers the failures) leaves Train's report count as it was,
    and the loop may catch the error and report again."""
    name = report.checkpoint_dir_name or ray.train.collective.broadcast_from_rank_zero(
        report.storage.make_default_checkpoint_dir_name()
    )
    ray.train.report(
        report.metrics,
        checkpoint=report.save(name, state_dict),
        checkpoint_dir_name=name,
        checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        validation=report.validation,
    )


def _report_async(report: _Report, state_dict: dict[str, Any]) -> None:
    """``ASYNC``: Train's report runs on a thread of its own while this one stages:
    it agrees on the name with the other ranks (a barrier) and hands the save to
    Train's upload thread, where it starts once the staging is done. Returns when
    both are. (Staged here, the copies come from the memory the caller's thread
    allocates from, as they would for the caller's own staging.)"""
    global _pending
    group = _save_group()
    resolved = _stateful_to_state_dict(state_dict)
    done: Future[None] = Future()
    staged: Future[dict[str, Any]] = Future()
    with _lock:
        _pending = done

    def save_staged(_placeholder: Checkpoint, name: str) -> Checkpoint:
        """Train's upload step (``checkpoint_upload_fn``), in its upload thread."""
        if done.done():  # Train retries an upload whose error reads like S3's: a
            # collective save is not made again by one rank alone
            raise done.exception() or RuntimeError("air-transfer: this save already ended")
        try:
            saved = report.save(name, staged.result(), group, staged=True)
        except BaseException as e:
            done.set_exception(e)
            raise
        done.set_result(None)
        return saved

    storage = report.storage
    made = train_reports_made()
    reporting = _reporter().submit(
        ray.train.report,
        report.metrics,
        # Train hands this to save_staged, which writes the real one: a staged
        # state dict has no directory of its own to upload.
        checkpoint=Checkpoint(storage.experiment_fs_path, storage.storage_filesystem),
        checkpoint_dir_name=report.checkpoint_dir_name,
        checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        checkpoint_upload_fn=save_staged,
        delete_local_checkpoint_after_upload=False,
        validation=report.validation,
    )
    try:
        staged.set_result(BlockingAsyncStager().stage(resolved))
    except BaseException as e:
        staged.set_exception(e)  # the save, if Train agreed, raises it too
        _forget(done)
        _wait(reporting)
        raise
    try:
        reporting.result()
    except BaseException:
        _forget(done)  # refused: Train starts the upload last, so none started
        raise
    if train_reports_made() == made:  # skipped (a worker failed at Train's barrier)
        _forget(done)


def _reporter() -> ThreadPoolExecutor:
    """The thread this worker's async reports call ``ray.train.report`` on."""
    global _reporting
    with _lock:
        if _reporting is None:
            _reporting = pool("air-transfer-dcp-report", 1)
        return _reporting


def _wait(call: Future[Any]) -> None:
    """Wait for ``call`` to end, whatever it raised (the caller raises its own)."""
    with contextlib.suppress(BaseException):
        call.result()


def _forget(save: Future[None]) -> None:
    """No save will end ``save``: the next report must not wait for it."""
    global _pending
    with _lock:
        if _pending is save:
            _pending = None


def _upload_mode(mode: CheckpointUploadMode, async_save: bool | None) -> CheckpointUploadMode:
    """``report``'s ``checkpoint_upload_mode``, the deprecated ``async_save`` folded in."""
    if not isinstance(mode, CheckpointUploadMode):
        raise TypeError(
            f"checkpoint_upload_mode must be a ray.train.CheckpointUploadMode, got {mode!r}"
        )
    if mode == CheckpointUploadMode.NO_UPLOAD:
        raise ValueError(
            "checkpoint_upload_mode=NO_UPLOAD: air_transfer.dcp.report saves the state "
            "dict straight into the run's storage, so the save is the upload; use SYNC "
            "(the default: return once saved) or ASYNC (return once staged)"
        )
    if async_save is not None:
        warnings.warn(
            "air_transfer.dcp.report(async_save=...) is deprecated: pass "
            "checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC (or SYNC), "
            "as to ray.train.report",
            DeprecationWarning,
            stacklevel=4,  # the caller of report (through positional_at_most)
        )
        if async_save and mode == CheckpointUploadMode.SYNC:
            return CheckpointUploadMode.ASYNC
    return mode


def wait_for_pending_save() -> None:
    """Wait until this worker's async save (if any) is complete.

    Raises:
        Exception: What that save raised (``ChecksumError``, ``OSError``...).
    """
    global _pending
    with _lock:
        pending, _pending = _pending, None
    if pending is not None:
        _unwrapped(pending.result)


def _stateful_to_state_dict(state_dict: dict[str, Any]) -> dict[str, Any]:
    """``state_dict`` with each ``Stateful`` value replaced by its ``state_dict()``, as
    ``dcp.async_save`` does before staging: the stager would otherwise deep-copy the
    object itself (its tensors left on their device, whatever else it refers to
    copied too, and an object that cannot be deep-copied failing), and DCP would call
    ``state_dict()`` later, in Train's upload thread."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}


def _save_group() -> dist.ProcessGroup | None:
    """A gloo group for async saves (None without a process group): DCP's collectives
    on the training group, from another thread, could interleave with the training
    loop's own and deadlock it. Made once, by every rank at its first async report."""
    global _async_group
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if _async_group is None:
        group = dist.new_group(backend="gloo")
        assert isinstance(group, dist.ProcessGroup)  # every rank is a member
        _async_group = group
    return _async_group


def load(
    state_dict: dict[str, Any],
    checkpoint: Checkpoint | None = None,
    *,
    planner: LoadPlanner | None = None,
) -> bool:
    """Load this rank's part of a Ray Train checkpoint into ``state_dict``, in place.

    Not ``torch.distributed.checkpoint.load``: that one takes a ``checkpoint_id`` or
    a ``storage_reader`` and returns None; this one finds Train's latest checkpoint
    itself and says whether there was one, so that a training loop reads
    ``if air_transfer.dcp.load(state): ...`` (a restart) at its start. Outside
    Train, call torch's with a ``NodeStorageReader``.

    Args:
        state_dict: What to load into, as for ``dcp.load``: tensors are filled in
            place, other values replaced.
        checkpoint: The checkpoint to load (default: the latest reported one,
            ``ray.train.get_checkpoint()``).
        planner: DCP's ``LoadPlanner``, as ``dcp.load`` takes it.

    Returns:
        True if a checkpoint was loaded; False if there is none (a first start),
        ``state_dict`` untouched.

    Raises:
        FileNotFoundError: The checkpoint has no ``.metadata`` (an incomplete save).
        ChecksumError: A byte range read back differs from what was written; like
            any error of reading (a truncated shard...), with ``state_dict``
            untouched.
    """
    if checkpoint is None:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return False
    reader = NodeStorageReader(checkpoint.path, checkpoint.filesystem)
    reader.check_complete()
    _unwrapped(lambda: dcp_load(state_dict, storage_reader=reader, planner=planner))
    return True
