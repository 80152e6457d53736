"""Ray Train's checkpoint manager and storage context, hooked: the third module that
touches Ray's private API (beside ``_ray``, Train's, and ``_ray_core``, Ray core's).

Node storage routes Train's pyarrow copies of checkpoints through its own transfers,
commits a SYNC report's round without the controller's poll, restores the newest
whole checkpoint and reclaims orphans, each by wrapping a private method named in
``_ray_names`` (pinned by a test): a Ray upgrade breaks this module alone.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol

import ray

from air_transfer.core import environ
from air_transfer.core.report_rounds import CommittedRound, ReportedRound

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

logger = logging.getLogger(__name__)


#: Set to 0 to keep Ray Train's own pyarrow copies for node storage (see below).
TRAIN_HOOKS_ENV = environ.TRAIN_HOOKS
P = ParamSpec("P")


def _install_once(without: str) -> Callable[[Callable[P, None]], Callable[P, bool]]:
    """Run the decorated hook installer once per process: True if it installed its
    hooks now or before; False, without running it, with ``AIR_TRANSFER_TRAIN_HOOKS=0``
    (Ray left untouched), or where this Ray lacks a private name it takes (an
    ImportError or AttributeError: logged, with ``without``, what Ray does then)."""

    def guard(install: Callable[P, None]) -> Callable[P, bool]:
        installed = False

        @functools.wraps(install)
        def once(*args: P.args, **kwargs: P.kwargs) -> bool:
            nonlocal installed
            if installed or os.environ.get(TRAIN_HOOKS_ENV, "1") == "0":
                return installed
            try:
                install(*args, **kwargs)
            except (ImportError, AttributeError) as e:
                logger.warning("air-transfer: %s (%s)", without, e)
                return False
            installed = True
            return True

        return once

    return guard


#: ``upload(filesystem, checkpoint_path, checkpoint, worker)``: the persisted
#: checkpoint, or None to let Ray Train copy it itself. ``worker``: the reporting
#: worker's actor id.
Upload = Callable[["pafs.FileSystem", str, "Checkpoint", str], "Checkpoint | None"]
#: ``download(filesystem, path, local_path)``: True if it copied the directory.
Download = Callable[["pafs.FileSystem", str, str], bool]
#: ``reclaim(filesystem, workers, tracked)``: Ray Train is stopping the group of
#: ``workers`` (actor ids); what their reports stored into ``filesystem`` and is not
#: in ``tracked`` (the checkpoint paths Train keeps) is an orphan.
Reclaim = Callable[["pafs.FileSystem", list[str], list[str]], None]


class Rounds(Protocol):
    """How reports into a run's storage commit their rounds (``train.rounds``)."""

    def ours(self, filesystem: pafs.FileSystem) -> bool:
        """Whether a run storing into ``filesystem`` commits its rounds."""

    def commit(self, report: ReportedRound, barrier: Callable[[], None]) -> bool:
        """Once Train took ``report``: False to wait for Train's registration."""

    def open_group(self, run: str, workers: list[str]) -> None:
        """Train starts a group of ``workers`` (actor ids)."""

    def processed(self, run: str, index: int) -> None:
        """Train took every report of round ``index``."""

    def close_group(self, run: str, workers: list[str]) -> CommittedRound | None:
        """Train stops the group; the newest round it committed."""


@_install_once(
    "Ray Train's checkpoint copies cannot be routed through node storage's chunked "
    "transfers; Ray's own copies are used"
)
def install_train_hooks(
    upload: Upload, download: Download, reclaim: Reclaim, rounds: Rounds
) -> None:
    """Route Ray Train's checkpoint copies through ``upload`` and ``download``, commit
    ``SYNC`` reports through ``rounds``, and tell ``reclaim`` when a worker group stops
    (once per process; True if installed now or before).

    Ray Train reports a checkpoint by copying its directory with
    ``pyarrow.fs.copy_files`` into the run's storage filesystem
    (``StorageContext.persist_current_checkpoint``, Train v2) and restores one the
    same way (``Checkpoint.to_directory`` -> ``_download_from_fs_path``). Through a
    pyarrow ``PyFileSystem`` every byte then crosses Python as a fresh 64 MiB
    ``bytes``, which on node storage costs 2-4x the disk. No public hook exists
    (``checkpoint_upload_fn`` must be passed to every ``report``), so for a storage
    filesystem that recognises the directory (``node_storage``) these two functions
    are wrapped: each asks ``upload``/``download`` first and falls back to Ray's own
    code for every other filesystem, every file, and whenever they decline.

    Train registers a checkpoint only once every worker's report of its round has
    reached the controller, at its next poll (``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S``),
    and a failure of one worker stops the group whatever the others are still
    reporting (ray-project/ray#41700). So a ``SYNC`` (or ``NO_UPLOAD``) report into a
    storage ``rounds.ours`` returns once ``rounds.commit`` committed its round (every
    rank's report taken by Train: they meet at ``ray.train.collective.barrier``), and
    the controller, before it stops a group (``CheckpointManager.
    before_worker_group_shutdown``), registers the newest round the group committed
    that Train has not, then calls ``reclaim`` knowing what it tracks; it opens each
    group it starts (``before_init_train_context``). A report whose round is not
    committed waits for Train's registration
    (``get_all_reported_checkpoints(COMMITTED)``), as every report did before.

    Setting ``AIR_TRANSFER_TRAIN_HOOKS=0`` leaves Ray untouched. A Ray without these
    names (pinned by a test) keeps its own copies, and that is logged once.
    """
    from ray.train import _checkpoint as checkpoint_module
    from ray.train.collective import barrier
    from ray.train.v2._internal.execution import context as context_module
    from ray.train.v2._internal.execution import storage as storage_module
    from ray.train.v2._internal.execution.checkpoint import checkpoint_manager as manager_module
    from ray.train.v2.api.report_config import CheckpointConsistencyMode, CheckpointUploadMode

    # Private names, untyped on purpose.
    storage: Any = storage_module
    _checkpoint: Any = checkpoint_module
    context: Any = context_module
    manager: Any = manager_module
    original_persist = storage.StorageContext.persist_current_checkpoint
    original_download = _checkpoint._download_from_fs_path
    original_report = context.TrainContext.report
    original_stop = manager.CheckpointManager.before_worker_group_shutdown
    original_start = manager.CheckpointManager.before_init_train_context
    report_signature = inspect.signature(original_report)
    committed = CheckpointConsistencyMode.COMMITTED
    asynchronous = CheckpointUploadMode.ASYNC
    original_after_report = manager.CheckpointManager.after_report

    @functools.wraps(original_persist)
    def persist_current_checkpoint(
        self: Any, checkpoint: Checkpoint, checkpoint_dir_name: str
    ) -> Checkpoint:
        path = self.build_checkpoint_path_from_name(checkpoint_dir_name)
        worker = ray.get_runtime_context().get_actor_id() or ""
        persisted = upload(self.storage_filesystem, path, checkpoint, worker)
        if persisted is None:
            by_ray: Checkpoint = original_persist(self, checkpoint, checkpoint_dir_name)
            return by_ray
        return persisted

    @functools.wraps(original_report)
    def report(self: Any, *args: Any, **kwargs: Any) -> None:
        made = self.report_call_index
        original_report(self, *args, **kwargs)
        storage = self.storage_context
        if self.report_call_index == made or not rounds.ours(storage.storage_filesystem):
            return  # skipped (a worker failed at Train's own barrier); not node storage
        call = report_signature.bind(self, *args, **kwargs).arguments
        in_background = call.get("checkpoint_upload_mode") == asynchronous
        stored = call.get("checkpoint") is not None and not in_background
        rank = self.get_world_rank()
        reported = ReportedRound(
            storage.experiment_fs_path,
            ray.get_runtime_context().get_actor_id() or "",
            rank,
            self.get_world_size(),
            self.report_call_index,
            path=self.get_checkpoint().path if stored else None,
            metrics=call["metrics"] if rank == 0 and not in_background else None,
            validation=call.get("validation", False),
            in_background=in_background,
        )
        if not rounds.commit(reported, barrier):
            self.get_all_reported_checkpoints(consistency_mode=committed)

    @functools.wraps(original_download)
    def download_from_fs_path(
        fs: pafs.FileSystem, fs_path: str, local_path: str, filelock: bool = True
    ) -> None:
        if not download(fs, fs_path, local_path):
            original_download(fs, fs_path, local_path, filelock)

    @functools.wraps(original_after_report)
    def after_report(self: Any, *args: Any, **kwargs: Any) -> None:
        original_after_report(self, *args, **kwargs)
        try:
            storage = self._storage_context
            if rounds.ours(storage.storage_filesystem):
                rounds.processed(storage.experiment_fs_path, self._current_report_index)
        except Exception as e:  # a cleanup: the notes go when the group stops
            logger.debug("air-transfer: cannot drop the notes of a processed round (%s)", e)

    @functools.wraps(original_start)
    def before_init_train_context(self: Any, workers: list[Any]) -> dict[str, list[Any]]:
        args: dict[str, list[Any]] = original_start(self, workers)
        try:
            storage = self._storage_context
            ids = [w.actor._actor_id.hex() for w in workers]
            if rounds.ours(storage.storage_filesystem):
                rounds.open_group(storage.experiment_fs_path, ids)
        except Exception as e:  # its reports then wait for Train's registration
            logger.warning("air-transfer: cannot open the worker group's rounds (%s)", e)
        return args

    @functools.wraps(original_stop)
    def before_worker_group_shutdown(self: Any, worker_group: Any) -> None:
        original_stop(self, worker_group)
        try:
            workers = [w.actor._actor_id.hex() for w in worker_group.get_workers()]
            storage = self._storage_context
            filesystem = storage.storage_filesystem
            if rounds.ours(filesystem):
                newest = rounds.close_group(storage.experiment_fs_path, workers)
                if newest is not None and newest.index > self._current_report_index:
                    _register(self, newest, filesystem)
            results = [*self._checkpoint_results, self._latest_checkpoint_result]
            results += [result for result, _ in self._pending_training_results.values()]
            tracked = sorted({r.checkpoint.path for r in results if r is not None})
        except Exception as e:  # instance attributes, not pinned; the GCS unreachable
            logger.warning(
                "air-transfer: cannot read what Ray Train tracks (%s: %s); checkpoints of "
                "a stopped round are left in storage, as by Ray itself",
                type(e).__name__,
                e,
            )
            return
        reclaim(filesystem, workers, tracked)

    storage.StorageContext.persist_current_checkpoint = persist_current_checkpoint
    context.TrainContext.report = report
    _checkpoint._download_from_fs_path = download_from_fs_path
    manager.CheckpointManager.before_worker_group_shutdown = before_worker_group_shutdown
    manager.CheckpointManager.before_init_train_context = before_init_train_context
    manager.CheckpointManager.after_report = after_report
    logger.debug("air-transfer: Ray Train's checkpoint copies go through node storage")


def _register(manager: Any, newest: CommittedRound, filesystem: pafs.FileSystem) -> None:
    """Register ``newest`` with Train's checkpoint ``manager`` as its poll would have
    (it then tracks, keeps and restores it): as the report of index ``newest.index``."""
    from ray.train import Checkpoint
    from ray.train.v2._internal.execution.training_report import _TrainingReport

    checkpoint = Checkpoint(newest.path, filesystem=filesystem)
    manager._current_report_index = newest.index - 1  # register_checkpoint adds one
    try:
        manager.register_checkpoint(
            _TrainingReport(checkpoint, metrics=newest.metrics, validation=newest.validation)
        )
    except RuntimeError as e:  # no event loop to notify waiters on: registered anyway
        logger.debug("air-transfer: registered %s without notifying (%s)", newest.path, e)
    logger.info(
        "air-transfer: registered checkpoint %s, whose round the workers committed before "
        "Ray Train's controller registered it",
        newest.path,
    )


#: ``choose(filesystem, paths)``: which of a run's checkpoints (paths of
#: ``filesystem``, newest first) a restart restores.
Choose = Callable[["pafs.FileSystem", list[str]], "str | None"]


@_install_once(
    "Ray Train's restore cannot skip a checkpoint that is not whole in the durable tier; "
    "it restores the latest it registered"
)
def install_restore_choice(choose: Choose) -> None:
    """Have Ray Train's controller ask ``choose`` which checkpoint a (re)started worker
    group restores, rather than take the latest one it registered (once per process;
    True if installed now or before). Train hands every worker of a new group the
    checkpoint ``CheckpointManager.before_init_train_context`` names; this wraps it,
    offering the run's checkpoints newest first (by report). Off with
    ``AIR_TRANSFER_TRAIN_HOOKS=0``, like the other hooks; a Ray without these names
    keeps its own choice, and that is logged once."""
    from ray.train.v2._internal.execution.checkpoint import checkpoint_manager as manager_module

    manager: Any = manager_module  # private, untyped on purpose
    original = manager.CheckpointManager.before_init_train_context

    @functools.wraps(original)
    def before_init_train_context(self: Any, workers: list[Any]) -> dict[str, list[Any]]:
        args: dict[str, list[Any]] = original(self, workers)
        latest = args.get("checkpoint", [None])[0] if args.get("checkpoint") else None
        if latest is None:
            return args
        try:
            order = self._checkpoint_to_report_index
            results = [r for r in self._checkpoint_results if r.checkpoint is not None]
            newest = sorted(results, key=lambda r: order.get(r.checkpoint, -1), reverse=True)
            by_path = {r.checkpoint.path: r.checkpoint for r in newest}
            paths = [latest.path, *(p for p in by_path if p != latest.path)]
        except AttributeError as e:  # instance attributes: not pinned by the test
            logger.warning("air-transfer: cannot read Ray Train's checkpoints (%s)", e)
            return args
        chosen = choose(latest.filesystem, paths)
        if chosen is not None and chosen != latest.path:
            args["checkpoint"] = [by_path[chosen]] * len(workers)
        return args

    manager.CheckpointManager.before_init_train_context = before_init_train_context
