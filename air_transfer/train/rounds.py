"""Rounds of Ray Train reports into node storage, committed by the workers and read by
the controller, kept in the cluster's GCS key-value store (``core.report_rounds``
says what is noted and why the newest committed round is the one that matters).

A ``SYNC`` report into node storage used to wait, after its bytes were stored, for
Train's controller to register it at its next poll (``RAY_TRAIN_HEALTH_CHECK_
INTERVAL_S``, 2 s by default), so that a failure right after the report resumes from
it. Now the workers commit the round themselves (``commit``), and the controller,
before it stops a group (``close_group``), registers the newest committed round it
has not registered, so the restart restores it and the stopped round's cleanup keeps
it.

A commit and the stop of its group are ordered through the store alone: the
controller marks each worker of a group it starts as open (``open_group``) and,
stopping it, first removes those marks and then reads the notes; a worker notes its
round done and then looks for its mark. Either the look finds the mark, and then the
note was there before the controller read (the controller registers the round), or
it does not, and the worker removes its note and waits for Train's own registration
instead (the controller stopped the group: the worker is about to be ended). A
worker that finds no mark because the controller runs without air-transfer's hooks
waits for Train's registration too, as before.

The GCS outlives every process but itself: a worker or a node that dies takes no
note with it. The notes of a round go once Train has processed the next one
(``processed``), and every note of the run when a group stops.
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Callable

import pyarrow.fs as pafs
import ray.cloudpickle

from air_transfer.cluster import _ray_core
from air_transfer.core.report_rounds import (
    CommittedRound,
    ReportedRound,
    newest_committed,
    record_of,
)
from air_transfer.storage.client.handler import node_storage_handler

#: The GCS key-value namespace of the notes.
NAMESPACE = "air_transfer_rounds"
#: What a note of a round is: rank 0's metrics, a rank's done record, an ASYNC report.
METRICS, DONE, IN_BACKGROUND = "metrics", "done", "async"


def ours(filesystem: pafs.FileSystem) -> bool:
    """Whether a run storing into ``filesystem`` commits its rounds here (node storage)."""
    return node_storage_handler(filesystem) is not None


def commit(report: ReportedRound, barrier: Callable[[], None]) -> bool:
    """Once Train took ``report`` (this worker's of its round): wait at ``barrier``
    until every rank's report of the round did, and, for a report that ``promises``
    its checkpoint, commit the round. True when the report may return; False when it
    waits for Train's own registration (a rank reported ``ASYNC``, or this worker's
    group is not open: stopped, or a controller without the hooks)."""
    alone = report.world_size == 1
    if report.in_background:
        if alone:
            return True  # nobody else commits the round
        key = _note_key(report.run, report.index, IN_BACKGROUND, report.worker)
        _ray_core.kv_put(NAMESPACE, key, b"")
    elif report.metrics is not None and not (alone and report.promises):
        key = _note_key(report.run, report.index, METRICS, report.worker)
        _ray_core.kv_put(NAMESPACE, key, ray.cloudpickle.dumps(report.metrics))  # rank 0's
    if not alone:
        barrier()
    if not report.promises:
        return True
    round_prefix = _round_prefix(report.run, report.index)
    if not alone and _ray_core.kv_keys(NAMESPACE, f"{round_prefix}{IN_BACKGROUND}/"):
        return False
    key = _note_key(report.run, report.index, DONE, report.worker)
    _ray_core.kv_put(NAMESPACE, key, ray.cloudpickle.dumps(record_of(report)))
    if _ray_core.kv_get(NAMESPACE, _open_key(report.run, report.worker)) is not None:
        return True
    _ray_core.kv_delete(NAMESPACE, key)
    return False


def open_group(run: str, workers: list[str]) -> None:
    """Train starts a group of ``workers`` (actor ids) for the run at ``run``: their
    commits count from now on."""
    for worker in workers:
        _ray_core.kv_put(NAMESPACE, _open_key(run, worker), b"")


def processed(run: str, index: int) -> None:
    """Train took every report of round ``index``: the notes of it and of the round
    before (a rank notes one after its report, before its next) are of no more use."""
    for done in (index - 1, index):
        _ray_core.kv_delete_prefix(NAMESPACE, _round_prefix(run, done))


def close_group(run: str, workers: list[str]) -> CommittedRound | None:
    """Train stops the group of ``workers``: no commit of theirs counts from now on.
    The newest round they committed (``newest_committed``; the caller registers it
    unless Train has); every note of the run's rounds is deleted."""
    for worker in workers:
        _ray_core.kv_delete(NAMESPACE, _open_key(run, worker))
    prefix = f"{_run_prefix(run)}/round/"
    stopping = set(workers)
    records, metrics = [], {}
    for key, value in _ray_core.kv_items(NAMESPACE, prefix).items():
        index, kind, worker = key[len(prefix) :].split("/")
        if worker not in stopping:
            continue  # a worker of a group stopped before, ended mid-note
        if kind == DONE:
            records.append(pickle.loads(value))
        elif kind == METRICS:
            metrics[int(index)] = pickle.loads(value)
    _ray_core.kv_delete_prefix(NAMESPACE, prefix)
    return newest_committed(records, metrics)


def _run_prefix(run: str) -> str:
    """The keys of the run whose experiment directory is ``run`` (any length of path)."""
    return hashlib.sha256(run.encode()).hexdigest()[:24]


def _open_key(run: str, worker: str) -> str:
    return f"{_run_prefix(run)}/open/{worker}"


def _round_prefix(run: str, index: int) -> str:
    return f"{_run_prefix(run)}/round/{index:012d}/"


def _note_key(run: str, index: int, kind: str, worker: str) -> str:
    return f"{_round_prefix(run, index)}{kind}/{worker}"
