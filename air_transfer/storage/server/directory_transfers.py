"""Node storage, the storage-node side: whole checkpoint directories served as shared
transfers (``DirectoryTransfers``, Ray Train's restores: ``NodeReads.directory_transfer``).

Each directory is packed as one transfer, keyed by what it holds now (every file's
version), and a transfer stays, whatever its size, while a reader that asked for it
is still reading (``DirectoryTransferLeases``): restores at the same time share one
pack, and the budget bounds only what is kept once they are done. Beyond that, the
budget, the cap and idleness are ``chunk_cache``'s.

Fan-out: a reader that asks while a reader on another node holds a lease on the same
transfer gets its *relay* (``transfer.fanout``): copies of the chunks made on the
node of the earliest such reader (one relay per transfer, made when the second node
asks; a ``streamed`` transfer's, a feed of it, when the first node asks, which its
own reader reads too), so that N nodes reading at once make this node push the checkpoint about
once, not N times (Ray pulls an object from any node holding it, and readers in step
find this node alone). The relay is dropped when the transfer's last reader lets go
(or when its node is gone: the next reader gets a new one); a reader whose relay was
lost mid-read reads the transfer itself (``storage.client.directory_reads``).
"""

from __future__ import annotations

import errno
import posixpath
import stat
import threading
import time
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import pyarrow.fs as pafs

from air_transfer.cluster.refs import CheckpointRef, DoneRef
from air_transfer.config import TransferConfig
from air_transfer.core.confine import Where, at, oserror
from air_transfer.core.confined_dirs import ConfinedSource, lstat_resolved
from air_transfer.core.knobs import KNOBS
from air_transfer.core.placed_mark import is_stub, stub_refused
from air_transfer.core.scan import Source, Stamp, scan
from air_transfer.storage.server.chunk_cache import capped, reaper
from air_transfer.transfer.fanout import Relayed

#: Starts a transfer of a directory owned by the agent: (checkpoint ref, completion).
StartTransfer = Callable[[Source, TransferConfig], tuple[CheckpointRef, DoneRef | None]]
#: A relay of a transfer on a node (``transfer.fanout.relay``), for a reader there
#: alone (True: no reader on another node yet) or for readers on other nodes; None
#: if the transfer is not relayed so.
Relay = Callable[[CheckpointRef, str, bool], Relayed | None]


class DirectoryTransferLeases:
    """The readers of directory transfers in flight, each holding a lease on the key
    of the transfer it reads, so that what they read is shared however large it is:
    the byte budget bounds what is kept for readers to come, not what readers in
    flight share. A reader that has not let go ``KNOBS.read_lease_s`` after it last
    asked is taken for dead. Not thread-safe: its owner's lock guards it."""

    def __init__(self) -> None:
        self._leases: dict[str, tuple[Hashable, float, str | None]] = {}
        self._readers: Counter[Hashable] = Counter()

    def take(self, key: Hashable, now: float, node: str | None = None) -> str:
        """A lease on ``key`` for a reader on ``node`` (None: not said)."""
        # Unique across agents: a reader may hand a lease back to a replaced agent.
        lease = uuid.uuid4().hex
        self._leases[lease] = (key, now, node)
        self._readers[key] += 1
        return lease

    def nodes(self, key: Hashable) -> list[str]:
        """The nodes of the readers holding a lease on ``key``, earliest first."""
        return [n for k, _, n in self._leases.values() if k == key and n is not None]

    def drop(self, lease: str) -> Hashable | None:
        """Let go of ``lease`` (unknown or expired: nothing); its key."""
        found = self._leases.pop(lease, None)
        if found is None:
            return None
        key = found[0]
        self._readers[key] -= 1
        if not self._readers[key]:
            del self._readers[key]
        return key

    def held(self, key: Hashable) -> bool:
        return key in self._readers

    def expire(self, now: float) -> None:
        for lease, (_, taken, _) in list(self._leases.items()):
            if now - taken >= KNOBS.read_lease_s:
                self.drop(lease)

    def __len__(self) -> int:
        return len(self._leases)


@dataclass
class _Transfer:
    ref: CheckpointRef
    size: int  # file bytes
    used: float  # time.monotonic() of the last request or release
    relay: tuple[str, Relayed] | None = None  # its node, the relay


class DirectoryTransfers:
    """Whole checkpoint directories of node storage, each version packed once as a
    transfer the agent owns and shared by every reader that asks for it while it is
    held. Ray Train's restores on other nodes ask for these (``train``), so N
    workers restoring one checkpoint read it from the storage node's disk once.

    A transfer stays while a reader that asked for it is still reading (``DirectoryTransferLeases``;
    ``release`` when done), whatever its size: readers at the same time share one
    pack. Beyond that, the same budget and idleness rules as ``FileChunks``."""

    def __init__(
        self,
        start: StartTransfer,
        cap: int | None = None,
        relay: Relay | None = None,
        live_nodes: Callable[[], set[str]] = set,
        here: str | None = None,
    ) -> None:
        self._start = start
        self._cap = cap  # ``cache_cap``: at most this many bytes kept, whatever asked
        self._relay = relay  # None: no fan-out (every reader gets the transfer itself)
        self._live_nodes = live_nodes  # the ids of the nodes alive now
        self._here = here  # this node's id: its readers read the transfer itself
        self._lock = threading.Lock()
        self._held: OrderedDict[Hashable, _Transfer] = OrderedDict()
        self._leases = DirectoryTransferLeases()
        self._budget = 0  # the cache_bytes of the last reader that asked
        self.bytes_held = 0  # file bytes of the transfers held
        self.started = 0  # transfers packed (tests, the bench)
        self.relays = 0  # relays made (tests, the bench)
        self.bytes_read = 0  # file bytes of the transfers packed: each read once
        self.bytes_served = 0  # file bytes of every transfer handed to a reader
        self._reaper = reaper("air-transfer-transfer-cache", self._expire_now)

    def ref(
        self, root: str, path: str, config: TransferConfig, node: str | None = None
    ) -> tuple[CheckpointRef, str, bool]:
        """The ref of a transferred checkpoint of directory ``path`` (confined to
        ``root``) as it is now, this reader's lease on it, to ``release`` once the
        checkpoint is read, and whether the ref is a relay's (for a reader on
        ``node`` while a reader on another node reads it; None: never a relay)."""
        real = at(root, path, lambda w: _directory(w, path))
        # Scanned and packed confined (``core.confined_dirs``), not by this path again.
        source = ConfinedSource(pafs.LocalFileSystem(), real, storage_root=root)
        scanned = scan(source, config.follow_symlinks)
        for stub in (f.path for f in scanned.files if is_stub(posixpath.join(real, f.path))):
            # A placed file's bytes are on its holders: never the record and zeros.
            raise stub_refused(posixpath.join(path, stub), "transfer the directory holding")
        key = (real, config, scanned.entries, tuple(map(_version, scanned.stamps)))
        now = time.monotonic()
        with self._lock:
            self._reaper.start()
            self._expire(now)
            held = self._held.get(key)
            if held is None:
                ref, _ = self._start(source, config)
                held = self._held[key] = _Transfer(ref, sum(f.size for f in scanned.files), now)
                self.started += 1
                self.bytes_read += held.size
                self.bytes_held += held.size
            else:
                self._held.move_to_end(key)
                held.used = now
            self.bytes_served += held.size
            relayed = None if node is None else self._relayed(key, held, node)
            lease = self._leases.take(key, now, node)
            self._budget = capped(config.cache_bytes, self._cap)
            self._shrink()
            return (held.ref, lease, False) if relayed is None else (relayed, lease, True)

    def _relayed(self, key: Hashable, held: _Transfer, node: str) -> CheckpointRef | None:
        """The relay of ``held`` for a reader on ``node``: the one made (on a node
        still alive), else one made now on the node of the earliest reader in flight
        on another node that is alive, or, with none, on ``node`` if its readers read
        such a relay too (a ``streamed`` transfer's). None for a reader on this node,
        or on the node of a relay its readers do not read."""
        if self._relay is None or node == self._here:
            return None
        others = [n for n in self._leases.nodes(key) if n not in (node, self._here)]
        if held.relay is not None and held.relay[0] not in self._live_nodes():
            held.relay = None
        if held.relay is None:
            live = self._live_nodes() if others else set()
            on = next((n for n in others if n in live), node)
            made = self._relay(held.ref, on, on == node)
            if made is None:
                return None
            held.relay = (on, made)
            self.relays += 1
        on, made = held.relay
        return made.ref if on != node or made.for_its_node else None

    def release(self, lease: str) -> None:
        """The reader holding ``lease`` is done: its transfer is kept now only within
        the budget (once no other reader holds it), and its relay only while one does."""
        with self._lock:
            key = self._leases.drop(lease)
            if key in self._held:
                self._held[key].used = time.monotonic()
            self._unrelay()
            self._shrink()

    def readers(self) -> int:
        """Readers in flight (leases held)."""
        with self._lock:
            return len(self._leases)

    def clear(self) -> None:
        """Drop every transfer and lease (readers keep the refs they hold)."""
        with self._lock:
            self._held.clear()
            self._leases = DirectoryTransferLeases()
            self.bytes_held = 0

    def _expire_now(self) -> None:
        with self._lock:
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        self._leases.expire(now)
        self._unrelay()
        for key, held in list(self._held.items()):
            if now - held.used >= KNOBS.read_cache_idle_s and not self._leases.held(key):
                self._drop(key)
        self._shrink()

    def _unrelay(self) -> None:
        """Let go of the relays of transfers no reader holds any more."""
        for key, held in self._held.items():
            if held.relay is not None and not self._leases.held(key):
                held.relay = None

    def _shrink(self) -> None:
        """Drop the least recently used transfers no reader holds, down to the budget."""
        for key in list(self._held):
            if self.bytes_held <= self._budget:
                return
            if not self._leases.held(key):
                self._drop(key)

    def _drop(self, key: Hashable) -> None:
        self.bytes_held -= self._held.pop(key).size


def _version(stamp: Stamp) -> Stamp:
    """What names a stored file's bytes (``ConfinedSource``): its stamp but for the
    ctime and link count, which other checkpoints' links change."""
    return stamp._replace(ctime_ns=None, nlink=None)


def _directory(w: Where, path: str) -> str:
    if not stat.S_ISDIR(lstat_resolved(w).st_mode):
        raise oserror(NotADirectoryError, errno.ENOTDIR, path, ": not a checkpoint directory")
    return w.real
