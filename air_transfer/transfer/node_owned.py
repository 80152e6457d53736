"""Transfers a node agent packs for another process (``owner="node"``) and holds
until that process lets go of them (a lease, ``cluster.transfer_leases``), with the
chunks of those transfers for later ones to reuse (``reuse_chunks``,
``transfer.live_chunks``).

The agent hosts one ``NodeOwnedTransfers``; callers name its methods
(``transfer.route`` asks for ``submit_transfer``). It packs
with ``transfer.start`` (``prepare`` then ``start``), below ``transfer.route``.
"""

from __future__ import annotations

from typing import Any

from air_transfer.cluster.refs import CheckpointRef
from air_transfer.cluster.rpc import served
from air_transfer.cluster.transfer_leases import HeldTransfers
from air_transfer.config import TransferConfig
from air_transfer.core.scan import Source
from air_transfer.transfer.live_chunks import LiveChunks
from air_transfer.transfer.start import prepare, start
from air_transfer.transfer.strategies import Registrations


class NodeOwnedTransfers(HeldTransfers):
    """The transfers held for other processes, by lease key (the checkpoint ref's hex)."""

    def __init__(self) -> None:
        #: Lease key -> (checkpoint ref, requester (pid, node), transfer id).
        self._leases: dict[str, tuple[CheckpointRef, tuple[int, str] | None, str]] = {}
        #: The chunks of those transfers, for later ones (``reuse_chunks``).
        self.live = LiveChunks()

    @served
    def submit_transfer(
        self,
        source: Source,
        config: TransferConfig,
        registered: Registrations | None = None,
        requester: tuple[int, str] | None = None,
    ) -> list[Any]:
        """Pack ``source`` here (``owner="node"``) with the strategies ``registered``
        in the caller: the agent submits the chunk tasks, so it owns them, and holds
        the checkpoint until ``requester`` (pid, node) says it references none of its
        refs. ``[checkpoint ref, completion ref, strategy, hex ids of the refs nested
        in it]``, nested so the caller borrows."""
        live = self.live if config.reuse_chunks else None
        started = start(prepare(source, config, registered), live)
        ref, handle = started.put(), started.handle
        self._leases[ref.hex()] = (ref, requester, handle.transfer_id)
        return [ref, started.done, handle.strategy.name, [r.hex() for r in handle.refs()]]

    def release(self, *keys: str) -> None:
        # The chunks go first, then the leases: a caller that no longer sees a lease
        # (``leases``, from another of the agent's threads) finds none of its chunks.
        self.live.drop(self._leases[key][2] for key in keys if key in self._leases)
        for key in keys:
            self._leases.pop(key, None)

    def leases(self) -> dict[str, tuple[int, str] | None]:
        return {key: requester for key, (_, requester, _) in self._leases.items()}
