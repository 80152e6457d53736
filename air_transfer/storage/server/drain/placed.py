"""The durable drain of a writer-placed storage, on the storage node: a placed file,
which node storage holds as a stub (``core.placed_mark``: a record of where its bytes
are, ``storage.placed_record``), measured and sent from the nodes that hold its bytes.

Its tier record is its writer's checksum list (the file's chunks as the writer cut
them), read from the first holder whose list has the sha256 the stub's record pins.
Its bytes are sent by the first holder that can (``holder_sends``, run by that node's
agent: they go from its disk to the tier, each chunk checked before it leaves), the
record's order kept (the writer's node first), so each node sends what it wrote and
every node sends at once. A holder that is gone, or whose bytes do not match, is
passed over with a warning naming it; with none left, the file fails for this pass,
naming what each holder did. What a holder says it stored counts only once the drain
confirms it in the tier itself, and only if the stub there still names the same
bytes (its size and checksums: a repair that gave it new holders meanwhile changes
neither; a file replaced meanwhile is the next pass's).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import get, innermost
from air_transfer.cluster.nodes import live_node_ids
from air_transfer.core.confine import open_regular, storage_path
from air_transfer.core.placed_mark import is_stub
from air_transfer.storage.durable.objects import TierObjects
from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.node_api import NodePlacedSends
from air_transfer.storage.node_wire import PlacedSend
from air_transfer.storage.placed_record import (
    RECORD_BYTES,
    Holder,
    PlacedRecord,
    PlacedSums,
    decode,
    decode_sums,
)
from air_transfer.storage.server.drain import files
from air_transfer.storage.server.drain.scan import Seen

logger = logging.getLogger(__name__)
T = TypeVar("T")


class PlacedFiles:
    """The placed files of node storage ``root``, whose holders keep their bytes under
    ``replica_root`` (formatted per node; None: a storage that is not writer-placed,
    none of whose files is taken for a stub here)."""

    def __init__(self, root: str, replica_root: str | None) -> None:
        self.root, self.replica_root = root, replica_root
        self._lock = threading.Lock()
        #: The record each stub had when it was measured, by path: what its send sends.
        self._measured: dict[str, tuple[tuple[int, int, int, int], PlacedRecord]] = {}
        #: Whether a holder's send failed since last asked (it may have left an upload
        #: open in the tier: a node lost mid-send never aborts its own).
        self._failed_sends = False

    def take_failed_sends(self) -> bool:
        """Whether a holder's send failed since the last call."""
        with self._lock:
            failed, self._failed_sends = self._failed_sends, False
        return failed

    def clear(self) -> None:
        """Forget the records measured (at the start of a pass: each pass measures
        again what it sends)."""
        with self._lock:
            self._measured.clear()

    def holds(self, seen: Seen) -> bool:
        """Whether ``seen`` is a placed file's stub (``measure`` and ``send`` it)."""
        return self.replica_root is not None and is_stub(storage_path(self.root, seen.rel))

    def measured(self, rel: str) -> bool:
        """Whether this pass measured ``rel`` as a placed file (``send`` sends it)."""
        with self._lock:
            return rel in self._measured

    def measure(self, seen: Seen) -> FileRecord | None:
        """The tier record of the placed file ``seen``: its writer's checksums, as a
        holder keeps them and its record pins them; None if it was replaced since the
        scan. ValueError for a record that is not valid, OSError naming every holder
        where none could hand over a list that matches."""
        placed = self._stub(seen)
        if placed is None:
            return None

        def one(agent: AgentClient, holder: Holder) -> PlacedSums:
            where = placed.sums_where(holder)
            data = get(agent.call(NodePlacedSends.placed_sums_bytes, holder[1], where))
            return decode_sums(data, placed, seen.rel, where)

        sums = self._first_holder(seen.rel, placed, one)
        with self._lock:
            self._measured[seen.rel] = (seen.version, placed)
        return FileRecord(placed.size, seen.mtime_ns, seen.mode, sums.chunk_bytes, sums.sums)

    def send(
        self,
        seen: Seen,
        record: FileRecord,
        objects: TierObjects,
        settings: DrainSettings,
    ) -> FileRecord | None:
        """Have a holder of ``seen``'s bytes upload them as ``record`` (``measure``'s)
        to its path in the tier: the record confirmed there, or None if the stub was
        replaced since it was measured."""
        with self._lock:
            measured = self._measured.pop(seen.rel, None)
        if measured is None or measured[0] != seen.version:
            return None
        placed = measured[1]
        send = PlacedSend(seen.rel, placed, record)
        target: DurableTarget = objects.target

        def one(agent: AgentClient, holder: Holder) -> FileRecord | None:
            try:
                made = get(
                    agent.call(NodePlacedSends.placed_send, holder[1], send, target, settings)
                )
            except BaseException:
                with self._lock:
                    self._failed_sends = True
                raise
            now = self._stub(seen, same_version=False)
            if now is None or (now.size, now.sums) != (placed.size, placed.sums):
                return None  # other bytes there now (a repair's new holders are the same)
            confirmed = files.confirm(objects, seen.rel, made, check_tag=True)
            if confirmed is None:
                raise OSError(
                    errno.EIO,
                    f"the tier does not hold what node {holder[0][:12]} says it stored",
                    target.path(seen.rel),
                )
            return confirmed

        return self._first_holder(seen.rel, placed, one)

    def _stub(self, seen: Seen, same_version: bool = True) -> PlacedRecord | None:
        """The record of the stub at ``seen``'s path, read now; None if there is no
        stub there now, or (``same_version``) it is not the one the scan saw."""
        assert self.replica_root is not None
        try:
            fd, st = open_regular(self.root, storage_path(self.root, seen.rel), stubs_ok=True)
        except FileNotFoundError:
            return None
        try:
            if not is_stub(fd) or (same_version and Seen.of(seen.rel, st).version != seen.version):
                return None
            head = os.pread(fd, RECORD_BYTES, 0)
        finally:
            os.close(fd)
        return decode(head, st.st_size, seen.rel, self.replica_root)

    def _first_holder(
        self,
        rel: str,
        placed: PlacedRecord,
        ask: Callable[[AgentClient, Holder], T],
    ) -> T:
        """``ask`` of the record's holders in turn, live ones only, until one answers;
        each that fails is logged; OSError naming what each did if none answers."""
        live = live_node_ids()
        tried: list[str] = []
        for holder in placed.holders:
            node = holder[0]
            if node not in live:
                tried.append(f"{node[:12]}: its node is not alive")
                continue
            try:
                return ask(AgentClient(node), holder)
            except Exception as e:
                cause = innermost(e)  # a holder's own error, not Ray's wrapping of it
                tried.append(f"{node[:12]}: {type(cause).__name__}: {cause}")
                logger.warning(
                    "air-transfer: the durable drain passes over node %s for placed file "
                    "%s (%s: %s); another holder is asked",
                    node[:12], rel, type(cause).__name__, cause,
                )  # fmt: skip
        raise OSError(
            errno.EIO,
            f"no holder of placed file {rel!r} could hand its bytes to the durable tier "
            f"({'; '.join(tried)}); the drain tries again at its next pass",
            rel,
        )
