"""The checkpoints under a directory of node storage, each with where it is kept
(``list_checkpoints``): what ``air-transfer ls`` prints, as typed records.

A checkpoint is a directory named ``checkpoint_*`` (Ray Train v2 names each report's
``checkpoint_<date>_<time>.<micros>``, v1 ``checkpoint_000000``) or one holding a
``.metadata`` file (a torch DCP checkpoint saved outside Train), wherever it lies
under the directory; what lies inside one is part of it.

Where each is kept is asked of the agent that drains its storage into a durable
tier, whether or not the filesystem given was opened with ``durable=...``: a
storage's drain is found by its root, at or above the checkpoint, so a listing
made without the tier's URI (and its secret) still says which checkpoints are
durable.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from air_transfer.core.fs_listing import list_below
from air_transfer.storage.client.durable_wait import StorageState, durable_now
from air_transfer.storage.client.handler import NodeStorageHandler, node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import NodeDurable

PREFIX = "checkpoint_"
DCP_METADATA = ".metadata"


@dataclass(frozen=True)
class CheckpointInfo:
    """One checkpoint under the directory listed.

    Attributes:
        path: Its absolute path in node storage.
        run: The directory it lies in, relative to the directory listed (its run's,
            for a Ray Train checkpoint; ``""`` when it lies right there).
        files: How many files it holds.
        nbytes: Their bytes, all together.
        mtime_ns: Its newest file's modification time (ns since the epoch; 0 if it
            holds no file).
        dcp: Whether it is a torch DCP checkpoint (it holds ``.metadata``).
        state: Where it is kept (``StorageState``: copies, durable, tier).
    """

    path: str
    run: str
    files: int
    nbytes: int
    mtime_ns: int
    dcp: bool
    state: StorageState

    @property
    def tier(self) -> str:
        """The safest place it is kept: ``local``, ``replicated`` or ``durable``."""
        return self.state.tier

    def age_s(self, now_ns: int | None = None) -> float | None:
        """Seconds since its newest file was written.

        Args:
            now_ns: The time to measure from (default: now), ns since the epoch.

        Returns:
            The age, or None if it holds no file.
        """
        if not self.mtime_ns:
            return None
        return round(((now_ns or time.time_ns()) - self.mtime_ns) / 1e9, 3)

    def to_dict(self, now_ns: int | None = None) -> dict[str, Any]:
        """The record ``air-transfer ls --json`` prints for it.

        Args:
            now_ns: The time its ``age_s`` is measured from (default: now).

        Returns:
            ``path``, ``run``, ``files``, ``bytes``, ``mtime_ns``, ``age_s``, ``dcp``,
            ``copies``, ``durable`` and ``tier``.
        """
        return {
            "path": self.path,
            "run": self.run,
            "files": self.files,
            "bytes": self.nbytes,
            "mtime_ns": self.mtime_ns,
            "age_s": self.age_s(now_ns),
            "dcp": self.dcp,
            "copies": self.state.copies,
            "durable": self.state.durable,
            "tier": self.tier,
        }


def list_checkpoints(filesystem: pafs.FileSystem, path: str) -> list[CheckpointInfo]:
    """Every checkpoint under ``path`` of node storage ``filesystem`` (a
    ``storage_filesystem()``), in path order, each with where it is kept.

    Args:
        filesystem: Node storage, as ``air_transfer.storage_filesystem`` returns it.
        path: A directory of it: a run's, or the root holding several runs.

    Returns:
        One ``CheckpointInfo`` per checkpoint (see the module for what counts as one).

    Raises:
        TypeError: ``filesystem`` is not node storage.
        FileNotFoundError: ``path`` does not exist.
        ConnectionError: the storage node (or every copy) cannot be reached.
    """
    handler = node_storage_handler(filesystem)
    if handler is None:
        raise TypeError(f"list_checkpoints takes a storage_filesystem(), got {filesystem!r}")
    [top] = filesystem.get_file_info([path])
    if top.type != pafs.FileType.Directory:
        raise FileNotFoundError(f"{path}: no directory of node storage there")
    drains = _Drains(handler)
    return [
        CheckpointInfo(p, run, files, nbytes, mtime, dcp, drains.state(p))
        for p, run, files, nbytes, mtime, dcp in find_checkpoints(filesystem, path)
    ]


Found = tuple[str, str, int, int, int, bool]


def find_checkpoints(fs: pafs.FileSystem, top: str) -> list[Found]:
    """Every checkpoint under ``top`` (see the module), in path order: its path, its
    run, its files, bytes and newest mtime, and whether it is a torch DCP one."""
    entries = [info for _, info in list_below(fs, top)]
    prefix = top.rstrip("/") + "/"
    dirs = {e.path for e in entries if e.type == pafs.FileType.Directory}
    marked = {
        posixpath.dirname(e.path)
        for e in entries
        if e.type == pafs.FileType.File and posixpath.basename(e.path) == DCP_METADATA
    }
    chosen = sorted({d for d in dirs if posixpath.basename(d).startswith(PREFIX)} | marked)
    tops: list[str] = []
    for d in chosen:  # sorted: an enclosing checkpoint comes before what it holds
        if not any(d.startswith(t + "/") for t in tops):
            tops.append(d)
    found = []
    for d in tops:
        inside = [e for e in entries if e.type == pafs.FileType.File and e.path.startswith(d + "/")]
        newest = max((e.mtime_ns or 0 for e in inside), default=0)
        run = posixpath.dirname(d)[len(prefix) :] if d.startswith(prefix) else ""
        found.append((d, run, len(inside), sum(e.size for e in inside), newest, d in marked))
    return found


class _Drains:
    """Where each path of one storage is kept, its drain found once per directory."""

    def __init__(self, handler: NodeStorageHandler) -> None:
        self.handler = handler
        self._drained: dict[str, bool] = {}

    def state(self, path: str) -> StorageState:
        handler = self.handler
        rel = posixpath.relpath(path, handler.root)
        rel = "" if rel == "." else rel
        if handler.durable is not None:
            durable = durable_now(handler.drain_point, rel)
            return StorageState(path, handler.copies_holding(path), durable)
        try:
            _, copy_root, link = handler.drain_point()
        except ConnectionError:  # no fresh copy to ask: nothing to say of a tier
            return StorageState(path, handler.copies_holding(path), None)
        at = posixpath.join(copy_root, rel) if rel else copy_root
        root = self._drained_root(link, at)
        if root is None:
            return StorageState(path, handler.copies_holding(path), None)
        status = link.call(NodeDurable.durable_status, root, at, True)  # asks the tier
        if isinstance(handler, ReplicatedHandler):
            return StorageState(path, handler.copies_holding(path), bool(status.durable))
        _, here, _ = link.call(NodeDurable.durable_locate, root, at)
        return StorageState(path, int(here), bool(status.durable))

    def _drained_root(self, link: AgentLink, at: str) -> str | None:
        """The root at or above ``at`` that ``link``'s agent drains, if one."""
        candidate = at
        while True:
            if candidate not in self._drained:
                try:
                    link.call(NodeDurable.durable_status, candidate)
                    self._drained[candidate] = True
                except ValueError:  # no durable tier for this root on that node
                    self._drained[candidate] = False
            if self._drained[candidate]:
                return candidate
            if candidate == "/":
                return None
            candidate = posixpath.dirname(candidate)
