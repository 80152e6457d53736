"""Ray Train's private API, in one of the two modules that touch Ray's private API
(the other, ``_ray_core``, holds Ray core's: the GCS, the object store, workers).

Ray Train's public API has no way to name a checkpoint's temporary directory, count
a worker's reports, copy settings to its workers, or store and restore a report's
checkpoint through node storage; these names are private and may move between Ray
releases. Keeping every such use here means an upgrade breaks one module, and
``PRIVATE_NAMES`` lets a test check that each name still exists in the installed Ray.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import ray

from air_transfer.core import environ

if TYPE_CHECKING:
    import pyarrow.fs as pafs
    from ray.train import Checkpoint

logger = logging.getLogger(__name__)

#: Every private name used below, as (module, dotted attribute): pinned by a test.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("ray.train", "Checkpoint._get_temporary_checkpoint_dir"),
    ("ray.train.v2._internal.execution.storage", "StorageContext.persist_current_checkpoint"),
    ("ray.train.v2._internal.execution.storage", "StorageContext.build_checkpoint_path_from_name"),
    ("ray.train._checkpoint", "_download_from_fs_path"),
    ("ray.train.v2._internal.execution.context", "TrainContext.report"),
    ("ray.train.v2._internal.execution.context", "TrainContext.report_call_index"),
    ("ray.train.v2._internal.execution.context", "get_train_context"),
    ("ray.train.v2._internal.execution.context", "TrainContext.get_all_reported_checkpoints"),
    (
        "ray.train.v2._internal.execution.checkpoint.checkpoint_manager",
        "CheckpointManager.before_worker_group_shutdown",
    ),
    ("ray.train.v2._internal.execution.worker_group.worker_group", "WorkerGroup.get_workers"),
    ("ray.train.v2._internal.constants", "ENV_VARS_TO_PROPAGATE"),
    ("ray.train.v2._internal.constants", "get_env_vars_to_propagate"),
    ("ray.train.v2._internal.constants", "is_v2_enabled"),
    (
        "ray.train.v2._internal.execution.checkpoint.checkpoint_manager",
        "CheckpointManager.before_init_train_context",
    ),
)


def temporary_checkpoint_dir(checkpoint: Checkpoint) -> str:
    """The fresh local directory ``ray.train.Checkpoint.to_directory()`` uses when
    given no path, so ours behaves the same."""
    return str(checkpoint._get_temporary_checkpoint_dir())


def checkpoint_uuid(checkpoint: Checkpoint) -> uuid.UUID:
    """The id a ``ray.train.Checkpoint`` names its temporary directory after; kept
    across pickling so copies of a checkpoint share their download directory."""
    value: uuid.UUID = checkpoint._uuid
    return value


def train_reports_made() -> int:
    """How many reports this Ray Train worker has made, by Train's own count. A
    report Train skips (a worker failed at its checkpoint-name barrier: it returns
    without uploading) leaves the count as it was, and says so no other way."""
    from ray.train.v2._internal.execution.context import get_train_context

    return int(get_train_context().report_call_index)


def require_train_v2() -> None:
    """ImportError saying what to do when Ray Train v1 is selected
    (``RAY_TRAIN_V2_ENABLED=0``): the library reports, uploads and hooks through
    Train v2 (Ray's default), and v1 lacks its names (``CheckpointUploadMode``...),
    which would otherwise fail an import deep inside with a bare ImportError. Ray
    decides it by this private function."""
    from ray.train.v2._internal.constants import is_v2_enabled

    if not is_v2_enabled():
        raise ImportError(
            "air-transfer needs Ray Train v2, Ray's default; RAY_TRAIN_V2_ENABLED=0 in "
            "this process's environment selects Train v1, which it does not support: "
            "unset RAY_TRAIN_V2_ENABLED (or set it to 1)"
        )


def propagate_to_train(names: Iterable[str]) -> bool:
    """Have Ray Train copy the environment variables ``names`` (those set) from the
    driver to its controller and from the controller to its workers, as it copies
    its own ``RAY_TRAIN_*`` settings: the one list it copies
    (``ENV_VARS_TO_PROPAGATE``, read when a run starts its controller and its
    workers) is private. True if added; a Ray without it is logged."""
    names = list(names)
    try:
        from ray.train.v2._internal import constants

        propagated: Any = constants.ENV_VARS_TO_PROPAGATE  # private, a set
        propagated.update(names)
    except (ImportError, AttributeError) as e:
        logger.warning(
            "air-transfer: Ray Train will not copy air-transfer's settings (%s) to its "
            "controller and workers (%s); set them in the job's runtime_env instead",
            ", ".join(names),
            e,
        )
        return False
    return True


#: Set to 0 to keep Ray Train's own pyarrow copies for node storage (see below).
TRAIN_HOOKS_ENV = environ.TRAIN_HOOKS
_train_hooks_installed = False
#: Whether this thread's last checkpoint persist went through ``upload`` (a ``SYNC``
#: report persists in the thread that reports).
_uploaded_here = threading.local()

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


def install_train_hooks(upload: Upload, download: Download, reclaim: Reclaim) -> bool:
    """Route Ray Train's checkpoint copies through ``upload`` and ``download``, and
    tell ``reclaim`` when a worker group stops (once per process; True if installed
    now or before).

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
    reached the controller, and a failure of one worker stops the group whatever the
    others are still reporting (ray-project/ray#41700). So a ``SYNC`` report whose
    checkpoint ``upload`` stored returns only once Train has registered it
    (``get_all_reported_checkpoints(COMMITTED)``, at the controller's next poll),
    and the controller calls ``reclaim`` before it stops a group
    (``CheckpointManager.before_worker_group_shutdown``), knowing what it tracks.

    Setting ``AIR_TRANSFER_TRAIN_HOOKS=0`` leaves Ray untouched. A Ray without these
    names (pinned by a test) keeps its own copies, and that is logged once.
    """
    global _train_hooks_installed
    if _train_hooks_installed:
        return True
    if os.environ.get(TRAIN_HOOKS_ENV, "1") == "0":
        return False
    try:
        from ray.train import _checkpoint as checkpoint_module
        from ray.train.v2._internal.execution import context as context_module
        from ray.train.v2._internal.execution import storage as storage_module
        from ray.train.v2._internal.execution.checkpoint import (
            checkpoint_manager as manager_module,
        )
        from ray.train.v2.api.report_config import CheckpointConsistencyMode

        # Private names, untyped on purpose.
        storage: Any = storage_module
        _checkpoint: Any = checkpoint_module
        context: Any = context_module
        manager: Any = manager_module
        original_persist = storage.StorageContext.persist_current_checkpoint
        original_download = _checkpoint._download_from_fs_path
        original_report = context.TrainContext.report
        original_stop = manager.CheckpointManager.before_worker_group_shutdown
        committed = CheckpointConsistencyMode.COMMITTED
    except (ImportError, AttributeError) as e:
        logger.warning(
            "air-transfer: Ray Train's checkpoint copies cannot be routed through "
            "node storage's chunked transfers (%s); Ray's own copies are used",
            e,
        )
        return False

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
        _uploaded_here.value = True
        return persisted

    @functools.wraps(original_report)
    def report(self: Any, *args: Any, **kwargs: Any) -> None:
        _uploaded_here.value = False
        original_report(self, *args, **kwargs)
        if _uploaded_here.value:  # a SYNC report, stored by upload
            _uploaded_here.value = False
            self.get_all_reported_checkpoints(consistency_mode=committed)

    @functools.wraps(original_download)
    def download_from_fs_path(
        fs: pafs.FileSystem, fs_path: str, local_path: str, filelock: bool = True
    ) -> None:
        if not download(fs, fs_path, local_path):
            original_download(fs, fs_path, local_path, filelock)

    @functools.wraps(original_stop)
    def before_worker_group_shutdown(self: Any, worker_group: Any) -> None:
        original_stop(self, worker_group)
        try:
            results = [*self._checkpoint_results, self._latest_checkpoint_result]
            results += [result for result, _ in self._pending_training_results.values()]
            tracked = sorted({r.checkpoint.path for r in results if r is not None})
            workers = [w.actor._actor_id.hex() for w in worker_group.get_workers()]
            filesystem = self._storage_context.storage_filesystem
        except AttributeError as e:  # instance attributes: not pinned by the test
            logger.warning(
                "air-transfer: cannot read what Ray Train tracks (%s); checkpoints of "
                "a stopped round are left in storage, as by Ray itself",
                e,
            )
            return
        reclaim(filesystem, workers, tracked)

    storage.StorageContext.persist_current_checkpoint = persist_current_checkpoint
    context.TrainContext.report = report
    _checkpoint._download_from_fs_path = download_from_fs_path
    manager.CheckpointManager.before_worker_group_shutdown = before_worker_group_shutdown
    _train_hooks_installed = True
    logger.debug("air-transfer: Ray Train's checkpoint copies go through node storage")
    return True


#: ``choose(filesystem, paths)``: which of a run's checkpoints (paths of
#: ``filesystem``, newest first) a restart restores.
Choose = Callable[["pafs.FileSystem", list[str]], "str | None"]
_restore_choice_installed = False


def install_restore_choice(choose: Choose) -> bool:
    """Have Ray Train's controller ask ``choose`` which checkpoint a (re)started worker
    group restores, rather than take the latest one it registered (once per process;
    True if installed now or before). Train hands every worker of a new group the
    checkpoint ``CheckpointManager.before_init_train_context`` names; this wraps it,
    offering the run's checkpoints newest first (by report). Off with
    ``AIR_TRANSFER_TRAIN_HOOKS=0``, like the other hooks; a Ray without these names
    keeps its own choice, and that is logged once."""
    global _restore_choice_installed
    if _restore_choice_installed:
        return True
    if os.environ.get(TRAIN_HOOKS_ENV, "1") == "0":
        return False
    try:
        from ray.train.v2._internal.execution.checkpoint import (
            checkpoint_manager as manager_module,
        )

        manager: Any = manager_module  # private, untyped on purpose
        original = manager.CheckpointManager.before_init_train_context
    except (ImportError, AttributeError) as e:
        logger.warning(
            "air-transfer: Ray Train's restore cannot skip a checkpoint that is not whole "
            "in the durable tier (%s); it restores the latest it registered",
            e,
        )
        return False

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
    _restore_choice_installed = True
    return True
