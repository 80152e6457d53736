"""Node storage, the wire: calls to the storage node's agent, and file bodies moved in
chunks through the object store with a bounded number in flight.

``AgentLink`` is the caller's connection to one storage node's agent: it finds the
agent by name, runs one disk operation per call, and turns Ray's wrappers back into
the OSError the agent raised. A read is the agent's streaming generator over one
file (``disk_reads``, confined to the storage root), consumed by the generator-backed
``ChunkFileReader``: ``window`` chunks ahead, and a seek to another chunk starts a new
stream there. Writes: ``chunk_writer``. Memory stays at a few chunks whatever the
file size.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import logging
from collections.abc import Iterator
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from air_transfer import _ray
from air_transfer.config import TransferConfig
from air_transfer.errors import SourceChangedError
from air_transfer.nodes import live_node_ids, node_agent
from air_transfer.reader import ChunkFileReader, buffered

logger = logging.getLogger(__name__)


class AgentLink:
    """The connection from this process to the agent of storage node ``node_id``,
    for files under ``root``, moving bodies as ``config`` says."""

    def __init__(self, node_id: str, root: str, config: TransferConfig) -> None:
        self.node_id, self.root, self.config = node_id, root, config
        self._agent: Any = None
        self._lost = False

    def agent(self) -> Any:
        """The storage node's agent (an actor handle), started if needed."""
        if self._agent is None:
            if self.node_id not in live_node_ids():
                raise ConnectionError(
                    f"storage node {self.node_id} is not a live node of this Ray cluster; "
                    "files stored on it are unreachable"
                )
            self._agent = node_agent(self.node_id)
            if self._lost:
                self._lost = False
                logger.warning(
                    "air-transfer: the agent of storage node %s was lost; a new one was started",
                    self.node_id,
                )
        return self._agent

    def call(self, op: str, *args: Any) -> Any:
        """Disk operation ``op`` on the storage node with this storage's root and
        ``args``; its result."""
        with self.errors():
            return ray.get(self.agent().disk.remote(op, self.root, *args))

    def submit(self, op: str, *args: Any) -> ray.ObjectRef[Any]:
        """Start disk operation ``op`` and return its ref (wait with ``wait``)."""
        with self.errors():
            ref: ray.ObjectRef[Any] = self.agent().disk.remote(op, self.root, *args)
            return ref

    def wait(self, ref: ray.ObjectRef[Any]) -> Any:
        with self.errors():
            return ray.get(ref)

    @contextlib.contextmanager
    def errors(self) -> Iterator[None]:
        """Raise the OSError or ValueError the agent raised (FileNotFoundError naming
        the path, ...), not Ray's wrapper with the agent's traceback (kept for anything
        else: a bug); a lost agent or node as ConnectionError."""
        try:
            yield
        except RayTaskError as e:
            if isinstance(e.cause, (OSError, ValueError)):
                # A copy: raised here, e.cause itself would get e as its __context__
                # while e holds it as .cause, a reference cycle that keeps e's
                # traceback, and every frame in it (a ChunkWriter's among them),
                # alive until the cyclic garbage collector happens to run.
                raise copy.copy(e.cause) from None
            raise
        except RayActorError as e:
            self._agent, self._lost = None, True
            raise ConnectionError(
                f"the air-transfer agent of storage node {self.node_id} is unreachable "
                f"({type(e).__name__}); its files cannot be reached until it is back"
            ) from e


def open_reader(link: AgentLink, path: str, local: str, size: int) -> io.BufferedReader:
    """A seekable stream over the ``size`` bytes of the file at node path ``local``."""
    cb = link.config.chunk_bytes
    raw = ChunkFileReader(path, size, 0, cb, lambda first: _chunks(link, local, size, first))
    return buffered(raw, cb)


def _chunks(link: AgentLink, local: str, size: int, first: int) -> Iterator[tuple[int, memoryview]]:
    """Chunks ``first``.. of the file at ``local``, streamed by the agent."""
    cb = link.config.chunk_bytes
    if first * cb >= size:
        return
    with link.errors():
        refs = _ray.streaming(link.agent().disk_read, link.config.window).remote(
            link.root, local, size, cb, first
        )
        for index, ref in enumerate(refs, first):
            try:
                chunk = ray.get(ref)
            except RayTaskError as e:
                if isinstance(e.cause, SourceChangedError):
                    raise SourceChangedError(
                        errno.ESTALE,
                        f"{e.cause.strerror} (on node {link.node_id}, chunk {index}); "
                        "read it again",
                        local,
                    ) from None
                raise
            del ref  # the store frees the chunk once it is consumed
            yield index, memoryview(chunk).cast("B")
