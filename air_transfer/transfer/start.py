"""Starting a transfer in the calling process, in two steps: ``prepare`` (the scan
and every check of the input, on the caller's thread, so bad input raises at the
call) and ``start`` (the strategy and the packer chosen, packing started, the
handle made), which ``transfer.route`` may run on a background thread
(docs/performance.md).

What goes into the object store is the transferred checkpoint itself, a
``ChunkedCheckpoint`` wrapping the handle, so that a task given the ref receives a
checkpoint. That class sits above this layer (and above the agent, which calls this):
the package root hands down how to make one (``CHECKPOINT_OF``, a ``core.provided``
slot), as it hands ``cluster.nodes`` the agent class.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import ray

from air_transfer.cluster import _ray_core
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import this_node_id
from air_transfer.cluster.refs import CheckpointRef, DoneRef, Status
from air_transfer.config import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.core.provided import Provided
from air_transfer.core.scan import Scan, Source, scan
from air_transfer.transfer.handle import TransferHandle, describe_current_process
from air_transfer.transfer.live_chunks import LiveChunks
from air_transfer.transfer.packers import Packer, agent_can_read, pack, select_packer
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.strategies import (
    PackRequest,
    Registrations,
    TransferStrategy,
    get_strategy,
    select_strategy,
)

#: What a transferred checkpoint is stored as: the ``ChunkedCheckpoint`` of a handle,
#: made by what the package root provides (loaded on first use, see above).
CHECKPOINT_OF: Provided[Callable[[TransferHandle], object]] = Provided(
    "the checkpoint of a transfer handle"
)


@dataclass(frozen=True)
class Prepared:
    """A transfer as far as the caller's thread takes it (``prepare``): the directory
    scanned, so bad input has raised; its manifest if it had to be checked there
    (None: made by ``start``); an explicitly chosen strategy, checked (None: chosen
    by ``start``)."""

    source: Source
    config: TransferConfig
    scanned: Scan
    manifest: Manifest | None
    strategy: TransferStrategy | None
    registered: Registrations | None


def prepare(
    source: Source, config: TransferConfig | None = None, registered: Registrations | None = None
) -> Prepared:
    """Scan ``source`` and check what ``start`` will pack: raises what the README's
    table lists for bad input (a missing directory, a symlink leaving it, a FIFO, a
    name no manifest can hold, a strategy refusing the checkpoint)."""
    config = config or TransferConfig()
    scanned = scan(source, follow_symlinks=config.follow_symlinks)
    # A local walk lists only names a manifest holds (``scan``): its manifest, the
    # entries' cost again, is left to ``start``. Another filesystem's names are
    # checked here.
    manifest = None if source.is_local else _manifest(scanned, config)
    strategy = None
    if config.strategy is not None:
        strategy = get_strategy(config.strategy, registered)()
        strategy.check(source, scanned.total_bytes, config)
    return Prepared(source, config, scanned, manifest, strategy, registered)


@dataclass(frozen=True)
class Started:
    """A transfer whose packing ``start`` started: its handle, usable at once, and a
    ref that resolves when every chunk is packed (raising what packing raised), or
    None if packing is done."""

    handle: TransferHandle
    done: DoneRef | None
    #: The live chunks it is recorded in (forgotten if nobody gets the checkpoint).
    live: LiveChunks | None = None

    def checkpoint(self) -> object:
        """The transferred checkpoint (a ``ChunkedCheckpoint``) of the handle."""
        return CHECKPOINT_OF.get()(self.handle)

    def put(self) -> CheckpointRef:
        """Put the transferred checkpoint: its ref, owned by this process."""
        try:
            return ray.put(self.checkpoint())
        except BaseException:
            if self.live is not None:  # nobody can read it: offer none of its chunks again
                self.live.drop([self.handle.transfer_id])
            raise


def start(prepared: Prepared, live: LiveChunks | None = None, blocking: bool = False) -> Started:
    """Pick a strategy (if ``prepared`` has none: by size against the free object
    store, among its registrations) and a packer (``select_packer``), and start
    packing, owned by this process. With ``live`` (an agent's,
    ``config.reuse_chunks``) a ``CHUNKS`` transfer of local files reuses the live
    chunks of the same file versions and is recorded there. ``blocking``: the
    caller waits until every chunk is packed, so packing may use this process too."""
    config, scanned = prepared.config, prepared.scanned
    manifest = prepared.manifest or _manifest(scanned, config)
    request = PackRequest(prepared.source, scanned.files, scanned.stamps, config)
    here = this_node_id()
    strategy = prepared.strategy or _select(prepared, manifest, here)
    reuse = live is not None and prepared.source.is_local
    packer = select_packer(
        strategy.layout, agent_reads=agent_can_read(prepared.source), blocking=blocking, reuse=reuse
    )
    # The packer proves every byte it reads against the scan's stamps, so the
    # manifest's sizes and mtimes are those of the bytes packed.
    transfer_id = uuid.uuid4().hex
    packed = pack(packer, strategy, request, live, transfer_id)
    live = live if packer is Packer.LIVE else None
    pending = packed.pending
    try:
        if not pending:
            # Not pending: every checksum is a str.
            manifest = manifest.with_checksums(cast(tuple[str, ...], packed.checksums))
        handle = TransferHandle(
            manifest=manifest,
            strategy=strategy,
            payload=packed.payload,
            config=config,
            owner=describe_current_process(),
            transfer_id=transfer_id,
            pending=packed.checksums if pending else None,
        )
        # A blocking call's copies and checksums alike (``Packed.stored``): once it
        # returns, nothing of the checkpoint depends on this node's agent.
        waits = (*(packed.stored or ()), *packed.checksums)
        args = cast(tuple[Status, ...], waits)  # Ray resolves refs passed as arguments
        done = AgentClient(here).call(PackingService.packed, *args) if pending and waits else None
    except BaseException:
        if live is not None:  # no transfer: nothing of it to offer again
            live.drop([transfer_id])
        raise
    return Started(handle, done, live)


def _select(prepared: Prepared, manifest: Manifest, here: str) -> TransferStrategy:
    """The strategy for ``prepared`` by size, against the free object store of this
    node, among its registrations (``select_strategy``)."""
    free = _ray_core.object_store_free_bytes(here)
    name = select_strategy(manifest.total_bytes, prepared.config, free, prepared.registered)
    return get_strategy(name, prepared.registered)()


def _manifest(scanned: Scan, config: TransferConfig) -> Manifest:
    """The manifest of what ``scanned`` lists, its checksums still to come."""
    return Manifest(entries=scanned.entries, chunk_bytes=config.chunk_bytes, chunks=None)
