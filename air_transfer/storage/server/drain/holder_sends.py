"""The durable drain of a writer-placed storage, on a node that holds a placed file's
bytes (``HolderSends``, the service of ``node_api.NodePlacedSends`` every node's agent
hosts): the blob's checksum list handed to the storage node's drain, which checks it
against the file's record itself, and the blob sent from this node's disk to the
tier, each chunk checked against that list before it leaves.

So each node uploads the bytes it holds, every node at once, and none of them passes
through the storage node. What the tier then holds, the drain confirms itself
(``drain.placed``): a holder's word that it sent a file is not what counts.
"""

from __future__ import annotations

import errno
import os
import posixpath
import threading
from collections.abc import Iterator

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import open_regular
from air_transfer.errors import ChecksumError
from air_transfer.storage.durable.objects import TierObjects
from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.node_api import NodePlacedSends
from air_transfer.storage.node_wire import PlacedSend
from air_transfer.storage.server.drain.files import RateLimit, upload

#: The largest checksum list handed over (a file of 64 TiB in chunks of 32 MiB).
MAX_SUMS_BYTES = 128 * 1024 * 1024


class HolderSends(NodePlacedSends):
    """This node's part in the drains of writer-placed storages; ``bytes_sent``: the
    bytes it stored in durable tiers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_sent = 0
        #: One cap per tier and rate: a drain's ``bytes_per_s`` holds for all of this
        #: node's sends into that tier, however many files it sends at once.
        self._limits: dict[tuple[str, int | None], RateLimit] = {}

    def placed_sums_bytes(self, root: str, path: str) -> bytes:
        fd, st = open_regular(root, path)
        try:
            if st.st_size > MAX_SUMS_BYTES:
                raise ValueError(
                    f"the checksum list {path!r} holds {st.st_size} bytes, more than a "
                    f"placed file's can ({MAX_SUMS_BYTES}): refused"
                )
            return os.pread(fd, st.st_size, 0)
        finally:
            os.close(fd)

    def placed_send(
        self, root: str, send: PlacedSend, target: DurableTarget, settings: DrainSettings
    ) -> FileRecord:
        where = posixpath.join(root, send.placed.blob)
        objects = TierObjects(target, settings.part_bytes, settings.max_parts)
        fd, st = open_regular(root, where)
        try:
            if st.st_size != send.record.size:
                raise ChecksumError(
                    errno.EIO,
                    f"the blob holds {st.st_size} bytes, its record {send.record.size}",
                    where,
                )
            chunks = _checked(fd, where, send.record)
            with self._lock:
                key = (target.uri, settings.bytes_per_s)
                limit = self._limits.setdefault(key, RateLimit(settings.bytes_per_s))
            made = upload(objects, send.rel, send.record, settings.codec, limit, chunks)
        finally:
            os.close(fd)
        with self._lock:
            self.bytes_sent += made.stored_size
        return made


def _checked(fd: int, where: str, record: FileRecord) -> Iterator[bytes]:
    """The chunks of the blob open as ``fd``, each as ``record`` has it; ChecksumError
    naming the blob and the chunk for one that is not (nothing of it leaves)."""
    for index in range(len(record.sums)):
        data = os.pread(fd, record.chunk_length(index), index * record.chunk_bytes)
        if len(data) != record.chunk_length(index) or chunk_checksum(data) != record.sums[index]:
            raise ChecksumError(
                errno.EIO,
                f"chunk {index} of the blob does not match what its writer recorded",
                where,
            )
        yield data
