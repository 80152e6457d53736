"""Node storage on K nodes, the writes: ``ReplicatedWriter`` stages a file on every
copy and commits it on each.

Each chunk is put in the object store once and every copy's agent writes it from
that one object (verified against its checksum there), at most ``window`` chunks
unacknowledged per copy. ``close`` commits on every copy still staged, within the
registry's ``begin``/``end`` (one commit of a path at a time, so the copies take a
path's versions in the same order; the staging files are named to the registry,
which removes them if this process dies mid-commit); a copy lost on the way (or
whose disk filled up) is stale from then on, and the file is stored if one fresh
copy took it. A copy being re-made (syncing) is not part of the answer: whatever it
says never fails the write. Anything but ``close`` (a failed write, a writer
dropped unclosed) removes every staging file: nothing published.
"""

from __future__ import annotations

import contextlib
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import ray

from air_transfer.config import TransferConfig
from air_transfer.core.checksum import chunk_checksum
from air_transfer.observe import deferred
from air_transfer.storage.client import replica_set
from air_transfer.storage.client.replica_set import full, is_lost, on_copy
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.client.uploads import UploadStream
from air_transfer.storage.node_api import Commit, NodeFiles
from air_transfer.storage.replica_wire import Copy, RegistryCalls


class Replicas(Protocol):
    """What the writer needs of its ``ReplicatedHandler``."""

    config: TransferConfig
    key: str

    def ensure(self) -> tuple[list[Copy], list[str], list[str], int]: ...
    def link_to(self, node: str, root: str) -> AgentLink: ...
    def rel(self, path: str) -> str: ...
    def judge(
        self, outcomes: dict[str, BaseException | None], fresh: list[str]
    ) -> tuple[BaseException | None, list[str]]: ...
    def degraded(self, missed: list[str], rels: list[str]) -> None: ...


@dataclass
class Staged:
    """One copy's staging file of the write."""

    node: str
    link: AgentLink
    path: str  # the file's path on that copy
    staging: str
    start: int
    expect: Any
    pending: deque[ray.ObjectRef[Any]] = field(default_factory=deque)
    error: BaseException | None = None


class ReplicatedWriter(UploadStream):
    """One file written to every copy of a replicated node storage."""

    def __init__(self, replicas: Replicas, path: str, append: bool) -> None:
        super().__init__()
        self.replicas, self.local, self.rel = replicas, path, replicas.rel(path)
        self.chunk_bytes, self.window = replicas.config.chunk_bytes, replicas.config.window
        self.written, self.failed, self.sent = 0, False, 0
        self.buffer = bytearray()
        deferred.start()  # here, never from a finalizer
        replicas.ensure()
        copies, fresh = replica_set.call(RegistryCalls.targets, replicas.key)
        self.fresh = set(fresh)
        self.staged: dict[str, Staged] = {}
        outcomes: dict[str, BaseException | None] = {}
        calls = []
        for node, root in copies:
            link, where = replicas.link_to(node, root), on_copy(root, self.rel)
            try:
                calls.append(
                    (node, link, where, link.submit(NodeFiles.fs_open_write, root, where, append))
                )
            except Exception as e:
                outcomes[node] = e
        for node, link, where, call in calls:
            try:
                staging, start, expect = link.wait(call)
                self.staged[node] = Staged(node, link, where, staging, start, expect)
                outcomes[node] = None
            except Exception as e:
                outcomes[node] = e
        # The fresh copies' answer is the storage's (a syncing copy may lack the
        # directory yet: repair copies the file onto it after); a fresh copy that
        # answered otherwise is not staged, so its commit counts it stale.
        answer, missed = replicas.judge(outcomes, fresh)
        if answer is not None:
            self._abort()
            raise answer
        for node in missed:
            s = self.staged.pop(node, None)
            if s is not None:
                _abort_one(s)

    def write(self, data: Any) -> int:
        self.check_writable()
        try:
            view = memoryview(data).cast("B")
            self.buffer += view
            while len(self.buffer) >= self.chunk_bytes:
                self._send(np.frombuffer(self.buffer, np.uint8, self.chunk_bytes).copy())
                del self.buffer[: self.chunk_bytes]
            self.written += len(view)
            return len(view)
        except BaseException:
            self._abort()
            raise

    def _send(self, chunk: np.ndarray) -> None:
        """Put ``chunk`` once; every copy still staged writes it from that object."""
        ref, checksum = ray.put(chunk), chunk_checksum(chunk)
        for s in self._live():
            try:
                while len(s.pending) >= self.window:
                    s.link.wait(s.pending.popleft())
                offset = s.start + self.sent
                call = s.link.submit(
                    NodeFiles.fs_write, s.link.root, s.staging, offset, ref, checksum
                )
                s.pending.append(call)
            except Exception as e:
                self._lose(s, e)
        self.sent += len(chunk)

    def _live(self) -> list[Staged]:
        live = [s for s in self.staged.values() if s.error is None]
        if not live:
            filled = [s.error for s in self.staged.values() if full(s.error)]
            if filled and filled[0] is not None:  # no copy had room: as on one disk
                raise filled[0]
            raise ConnectionError(f"every copy of {self.local!r} was lost while it was written")
        return live

    def _lose(self, s: Staged, error: BaseException) -> None:
        """Copy ``s`` failed a chunk: it is out of this write if it is gone, its
        disk is full, or it is not fresh (a copy being re-made, whose directory
        repair may replace); any other answer of a fresh copy is the write's."""
        if not (is_lost(error) or full(error) or s.node not in self.fresh):
            raise error
        s.error = error

    def close(self) -> None:
        """Commit the file on every copy: whole on each, or (after a failure) on none."""
        if self.closed:
            return
        try:
            if not self.failed:
                self._commit()
        except BaseException:
            self._abort()
            raise
        finally:
            super().close()

    def _commit(self) -> None:
        tail, size = np.frombuffer(bytes(self.buffer), np.uint8), self.sent + len(self.buffer)
        checksum = chunk_checksum(tail)
        op = uuid.uuid4().hex
        staging = {node: s.staging for node, s in self.staged.items()}
        targets, fresh = replica_set.begin(self.replicas.key, [self.rel], op, staging)
        # Copies staged here whose node the registry has since found gone: this write
        # lacks them too (degraded), though no commit was tried there.
        gone = [node for node in self.staged if node not in dict(targets)]
        outcomes: dict[str, BaseException | None] = {}
        try:
            for node, _ in targets:
                s = self.staged.get(node)
                if s is None:
                    outcomes[node] = ConnectionError("not staged: was stale when the write began")
                    continue
                outcomes[node] = s.error or self._commit_one(s, tail, checksum, size, op)
        finally:
            answer, missed = self.replicas.judge(outcomes, fresh)
            replica_set.call(RegistryCalls.end, self.replicas.key, op, missed, [self.rel])
        for node, s in self.staged.items():
            if node not in dict(targets) or outcomes.get(node) is not None:
                _abort_one(s)
        self.staged.clear()
        if missed or gone:
            self.replicas.degraded([*missed, *gone], [self.rel])
        if answer is not None:
            raise answer

    def _commit_one(
        self, s: Staged, tail: Any, checksum: str, size: int, op: str
    ) -> BaseException | None:
        try:
            while s.pending:
                s.link.wait(s.pending.popleft())
            offset, total = s.start + self.sent, s.start + size
            commit = Commit(s.path, s.staging, offset, tail, checksum, total, False, s.expect)
            s.link.call(NodeFiles.fs_commit, s.link.root, commit, op)
            return None
        except Exception as e:
            return e

    def _abort(self) -> None:
        self.failed = True
        staged, self.staged = list(self.staged.values()), {}
        for s in staged:
            _abort_one(s)

    def __del__(self) -> None:
        if not self.closed:  # dropped unclosed: the upload did not finish
            self.failed = True
            staged, self.staged = list(self.staged.values()), {}
            deferred.soon(lambda: _abort_all(staged))
            UploadStream.close(self)


def _abort_one(s: Staged) -> None:
    """Remove one copy's staging file once its chunk writes in flight are done."""
    if not ray.is_initialized():
        return
    for ref in s.pending:
        with contextlib.suppress(Exception):
            s.link.wait(ref)
    with contextlib.suppress(Exception):
        s.link.call(NodeFiles.fs_abort, s.link.root, s.staging)


def _abort_all(staged: list[Staged]) -> None:
    for s in staged:
        _abort_one(s)
