"""Node storage, the wire: what a write is made of. An upload's ``Mode`` (where its
bytes go: its ``Route``), each copy's staging file it writes (``Staged``), the rules
a write to several copies follows (``CopyRules``), and how one copy's staging file
is removed (``abort_copy``). ``uploads.NodeUpload`` writes by them.
"""

from __future__ import annotations

import contextlib
import enum
import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import ray

from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import NodeFiles
from air_transfer.storage.node_wire import Expect

logger = logging.getLogger(__name__)

#: A chunk write in flight: waited on before the commit, its value unused.
Pending = ray.ObjectRef[Any]


class Route(enum.Enum):
    """Where an upload's bytes go."""

    HERE = "here"  # straight into the staging file, from this process
    SEND = "send"  # each chunk to every copy's agent (``fs_write``)
    OFFER = "offer"  # each chunk offered to the agent, which reuses what it holds


@dataclass(frozen=True)
class Mode:
    """How a ``NodeUpload`` writes: its route, whether its commit names every file
    chunk's checksum (``IndexedCommit``; from offset 0 only), and whether the storage
    node writes around the page cache."""

    route: Route
    indexed: bool = False
    direct_io: bool = False


@dataclass
class Staged:
    """One copy's staging file of the write."""

    node: str
    link: AgentLink
    path: str  # the file's path on that copy
    staging: str
    start: int
    expect: Expect  # what the commit expects at ``path`` (appends)
    pending: deque[Pending] = field(default_factory=deque)
    error: BaseException | None = None  # the copy left the write (``CopyRules``)


class CopyRules(Protocol):
    """How a write to several copies goes on and ends (``replica_write.ReplicaWrite``);
    without rules, every error of the one copy is the write's."""

    def can_lose(self, copy: Staged, error: Exception) -> bool:
        """Whether the write goes on without ``copy``, which failed a chunk."""
        ...

    def commit(self, copies: list[Staged], commit: Callable[[Staged, str], None]) -> None:
        """Commit on ``copies`` (``commit(copy, op)``), abort (``abort_copy``) those
        that did not take it, empty ``copies``, and raise the storage's answer."""
        ...


def abort_copy(s: Staged) -> None:
    """Remove copy ``s``'s staging file once its chunk writes in flight are done (so
    that none fails unseen, and none lands after the removal); an agent gone
    meanwhile leaves it hidden (``air-transfer clean`` removes it)."""
    if not ray.is_initialized():  # Ray is gone (interpreter exit): so is the agent
        return
    pending, s.pending = list(s.pending), deque()
    for ref in pending:
        with contextlib.suppress(Exception):
            s.link.wait(ref)
    try:
        s.link.call(NodeFiles.fs_abort, s.link.root, s.staging)
    except Exception as e:
        logger.warning("air-transfer: could not remove the staging file %s: %s", s.staging, e)
