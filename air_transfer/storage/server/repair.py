"""Node storage replicas, repair: re-make the copies a storage is short of, in the
background, at a bounded rate.

Runs in the replica registry's actor (``replica_host``, every ``POLL_S``), one
storage and one copy at a time. Bytes never pass through it: the target's agent
writes the chunks the source's agent packs (``file_chunks``, verified by
``fs_write``), and each file is published whole (``fs_commit``). A copy being
re-made is claimed (``replica_marker``: never a directory that holds what the
storage did not write, or another copy's) and emptied first, then takes every write
(``ReplicaRegistry.begin``) while the tree is copied; what was written meanwhile is
copied again from the source until a pass finds nothing new, and only then is it
fresh. A copy that fails part-way stays stale and is tried again later, up to
``MAX_ATTEMPTS`` times in a row; then it is given up on, loudly (an error logged, a
metric, its state in ``replica_status``), and made on another node.
"""

from __future__ import annotations

import logging
import os
import posixpath
import time
from collections.abc import Callable
from typing import TypeVar, cast, overload

import pyarrow.fs as pafs
import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import get as _ray_get
from air_transfer.cluster.fetch import raise_own
from air_transfer.config import TransferConfig
from air_transfer.core import environ
from air_transfer.core.checksum import chunk_checksum
from air_transfer.observe import replica_metrics
from air_transfer.storage.node_api import (
    ChunkAt,
    Commit,
    NodeCopies,
    NodeFiles,
    NodeMetadata,
    NodeReads,
)
from air_transfer.storage.placed_record import RECORD_BYTES
from air_transfer.storage.replica_wire import on_copy
from air_transfer.storage.server.replica_record import MAX_ATTEMPTS
from air_transfer.storage.server.replica_registry import Copy, ReplicaRegistry

logger = logging.getLogger(__name__)

#: Repair's bandwidth bound, per registry (MiB/s of file bytes copied).
RATE_ENV = environ.REPAIR_MIB_S


class Pace:
    """At most ``rate`` bytes per second, on average, through ``take`` (which sleeps
    as long as the bytes taken are ahead of the rate)."""

    def __init__(
        self,
        rate: float,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.rate, self.clock, self.sleep = rate, clock, sleep
        self.start, self.taken = clock(), 0

    def take(self, nbytes: int) -> None:
        self.taken += nbytes
        ahead = self.taken / self.rate - (self.clock() - self.start)
        if ahead > 0:
            self.sleep(ahead)


T = TypeVar("T")


@overload
def get(refs: ray.ObjectRef[T]) -> T: ...


@overload
def get(refs: list[ray.ObjectRef[T]]) -> list[T]: ...


def get(refs: ray.ObjectRef[T] | list[ray.ObjectRef[T]]) -> T | list[T]:
    """The result of agent calls, an error they raised as itself (FileNotFoundError
    for a file deleted while repair copies it), not Ray's wrapper."""
    try:
        return _ray_get(refs)
    except ray.exceptions.RayTaskError as e:
        raise_own(e)
        raise


def repair_rate() -> float:
    return float(os.environ.get(RATE_ENV, "256")) * 1024 * 1024


class Copier:
    """Copies paths of a storage from the ``source`` copy to the ``target`` copy."""

    def __init__(self, source: Copy, target: Copy, pace: Pace) -> None:
        (self.snode, self.sroot), (self.tnode, self.troot) = source, target
        self.s, self.t = AgentClient(self.snode), AgentClient(self.tnode)
        self.pace, self.cb = pace, TransferConfig().chunk_bytes

    def on_source(self, rel: str) -> str:
        return on_copy(self.sroot, rel)

    def on_target(self, rel: str) -> str:
        return on_copy(self.troot, rel)

    def empty_target(self) -> None:
        get(self.t.call(NodeMetadata.fs_create_dir, self.troot, self.troot, True))
        get(self.t.call(NodeMetadata.fs_delete_dir_contents, self.troot, self.troot, True))

    def sync(self, rel: str) -> int:
        """Make ``rel`` on the target what it is on the source now; bytes copied."""
        [(ftype, size, _)] = get(
            self.s.call(NodeMetadata.fs_info, self.sroot, [self.on_source(rel)])
        )
        tpath = self.on_target(rel)
        if rel:
            [(ttype, _, _)] = get(self.t.call(NodeMetadata.fs_info, self.troot, [tpath]))
            if ttype == pafs.FileType.Directory:
                get(self.t.call(NodeMetadata.fs_delete_dir, self.troot, tpath))
            elif ttype != pafs.FileType.NotFound and ftype != pafs.FileType.File:
                get(self.t.call(NodeMetadata.fs_delete_file, self.troot, tpath))
        if ftype == pafs.FileType.File:
            get(self.t.call(NodeMetadata.fs_create_dir, self.troot, posixpath.dirname(tpath), True))
            return self.copy_file(rel, size or 0)
        if ftype != pafs.FileType.Directory:
            return 0
        get(self.t.call(NodeMetadata.fs_create_dir, self.troot, tpath, True))
        listed = get(self.s.call(NodeMetadata.fs_list, self.sroot, self.on_source(rel), True, True))
        copied = 0
        for sub, kind, sub_size, _ in sorted(listed):
            path = posixpath.join(rel, sub) if rel else sub
            if kind == pafs.FileType.Directory:
                get(self.t.call(NodeMetadata.fs_create_dir, self.troot, self.on_target(path), True))
            elif kind == pafs.FileType.File:
                try:
                    copied += self.copy_file(path, sub_size or 0)
                except FileNotFoundError:  # deleted meanwhile: that delete is touched,
                    continue  # and the next pass makes the target agree
        return copied

    def copy_file(self, rel: str, size: int) -> int:
        """One file, chunk by chunk from the source's agent to the target's."""
        spath, tpath = self.on_source(rel), self.on_target(rel)
        # A placed file's stub is copied as one: its record, sparse, marked.
        stub = get(self.s.call(NodeReads.placed_head, self.sroot, spath, RECORD_BYTES))
        staging, _, _ = get(self.t.call(NodeFiles.fs_open_write, self.troot, tpath, False))
        try:
            if stub is not None:
                return self.copy_stub(tpath, staging, *stub)
            count = -(-size // self.cb)
            for first in range(0, count, 4):
                n = min(4, count - first)
                [pairs] = get(
                    self.s.call(
                        NodeReads.file_chunks, self.sroot, spath, size, self.cb, first, n, 0
                    )
                )
                writes = [
                    self.t.call(
                        NodeFiles.fs_write,
                        self.troot,
                        ChunkAt(staging, (first + i) * self.cb),
                        chunk,
                        cast(str, checksum),  # Ray resolves a ref passed as an argument
                    )
                    for i, (chunk, checksum) in enumerate(pairs)
                ]
                get(writes)
                self.pace.take(min(size, (first + n) * self.cb) - first * self.cb)
            commit = Commit(tpath, staging, size, b"", chunk_checksum(b""), size)
            get(self.t.call(NodeFiles.fs_commit, self.troot, commit))
        except BaseException:
            try:
                get(self.t.call(NodeFiles.fs_abort, self.troot, staging))
            except Exception as e:  # the target is gone: the staging file goes with it
                logger.debug("air-transfer: could not remove repair staging %s: %r", staging, e)
            raise
        return size

    def copy_stub(self, tpath: str, staging: str, size: int, head: bytes) -> int:
        """A stub of ``size`` bytes beginning with ``head`` (its record and zeros),
        written as the writer wrote it: those bytes and the last, the rest a hole."""
        head = head.rstrip(b"\0")[: size - 1]
        at = ChunkAt(staging, 0)
        get(self.t.call(NodeFiles.fs_write, self.troot, at, head, chunk_checksum(head)))
        tail = b"\0"
        commit = Commit(tpath, staging, size - 1, tail, chunk_checksum(tail), size, placed=True)
        get(self.t.call(NodeFiles.fs_commit, self.troot, commit))
        return len(head) + 1


def repair_one(
    registry: ReplicaRegistry,
    key: str,
    live: set[str],
    pace: Pace,
    leaving: frozenset[str] = frozenset(),
) -> bool:
    """Re-make one copy of storage ``key`` (True if one was made fresh), elsewhere
    than on a node that will go (``leaving``). Its root is claimed first
    (``replica_marker``: refused if it is another copy's directory or holds files the
    storage did not write, which emptying it would destroy)."""
    plan = registry.plan_repair(key, live, leaving)
    if plan is None:
        return False
    source, target = plan
    try:
        copier = Copier(source, target, pace)
        view = registry.view(key)
        members = [n for n, _ in view[0]] if view else []
        claim = copier.t.call(
            NodeCopies.claim_copy, target[1], key, target[0], members, registry.keys(), False
        )
        get(claim)
        copier.empty_target()
        total = copier.sync("")
        registry.note_bytes(key, total)
        while True:
            got = registry.take_touched(key, target[0])
            if got is None:
                return False  # it missed a write meanwhile: planned again later
            touched, busy = got
            if not touched and not busy and registry.finish_sync(key, target[0]):
                break
            for rel in sorted(touched):
                copier.sync(rel)
            if busy and not touched:
                time.sleep(0.05)  # a write in flight: its end names what it touched
    except Exception as e:
        failed(registry, key, target[0], e)
        return False
    logger.info("air-transfer: storage %s has a complete copy again on node %s", key, target[0])
    return True


def failed(registry: ReplicaRegistry, key: str, node: str, error: BaseException) -> None:
    """Repair of the copy on ``node`` failed: recorded (``replica_status`` reads it),
    counted (``air_transfer_replica_repair_failures``), logged; given up on after
    ``MAX_ATTEMPTS`` in a row, loudly."""
    f = registry.repair_failed(key, node, f"{type(error).__name__}: {error}")
    replica_metrics.repair_failed()
    if f.given_up:
        logger.error(
            "air-transfer: gave up repairing the copy of %s on node %s after %d failures "
            "(last: %s); it stays out of the storage (replica_status says so), and a copy "
            "is made on another node if one is free",
            key,
            node[:12],
            f.attempts,
            f.error,
        )
    else:
        logger.warning(
            "air-transfer: repair of the copy of %s on node %s failed (%s); attempt %d of "
            "%d, tried again later",
            key,
            node[:12],
            f.error,
            f.attempts,
            MAX_ATTEMPTS,
        )


def note_size(registry: ReplicaRegistry, key: str, live: set[str]) -> None:
    """Note how many bytes storage ``key`` holds (from a fresh live copy)."""
    view = registry.view(key)
    if view is None:
        return
    copies, fresh, _, _ = view
    roots = dict(copies)
    for node in (n for n in fresh if n in live):
        try:
            listed = get(
                AgentClient(node).call(NodeMetadata.fs_list, roots[node], roots[node], True, True)
            )
        except (OSError, ray.exceptions.RayError):
            continue
        registry.note_bytes(key, sum(size or 0 for _, kind, size, _ in listed if kind == 2))
        return


def repair_pass(
    registry: ReplicaRegistry, live: set[str], leaving: frozenset[str] = frozenset()
) -> None:
    """Count what is short of K copies, and re-make it; a copy on a node that Ray
    says will go (``leaving``: downscaled, preempted) is made elsewhere first."""
    for key, _, _ in registry.under_replicated(live, leaving):
        note_size(registry, key, live)
    replica_metrics.under_replicated(registry.missing_bytes(live))
    for key, _, _ in registry.under_replicated(live, leaving):
        repair_one(registry, key, live, Pace(repair_rate()), leaving)
