"""Starting a transfer in the calling process, in two steps: ``prepare`` (the scan
and every check of the input, on the caller's thread, so bad input raises at the
call) and ``start`` (strategy selection and the packing tasks' submission, which
``transfer.submit`` may run on a background thread: docs/performance.md)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import ray

from air_transfer.cluster import _ray
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import this_node_id
from air_transfer.config import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.core.scan import Scan, Source, scan
from air_transfer.observe import metrics
from air_transfer.transfer.handle import TransferHandle, describe_current_process
from air_transfer.transfer.live_chunks import LiveChunks
from air_transfer.transfer.packing_service import PackingService
from air_transfer.transfer.strategies import (
    PackRequest,
    Registrations,
    TransferStrategy,
    get_strategy,
    select_strategy,
)
from air_transfer.transfer.strategies.agent_tasks import submit_plans
from air_transfer.transfer.strategies.chunked import ChunkedStrategy


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


def start(
    prepared: Prepared, live: LiveChunks | None = None, blocking: bool = False
) -> tuple[TransferHandle, ray.ObjectRef[Any] | None]:
    """Pick a strategy (if ``prepared`` has none: by size against the free object
    store, among its registrations) and start packing in this node's agent, owned by
    this process: the handle, usable at once, and a ref that resolves when every
    chunk is packed (raising what packing raised), or None if packing is done. With
    ``live`` (an agent's, ``config.reuse_chunks``) a ``chunked`` transfer reuses the
    live chunks of the same file versions and is recorded there. ``blocking``: the
    caller waits until every chunk is packed, so the strategy may pack in this
    process too (``TransferStrategy.submit_blocking``)."""
    config, scanned = prepared.config, prepared.scanned
    manifest = prepared.manifest or _manifest(scanned, config)
    request = PackRequest(prepared.source, scanned.files, scanned.stamps, config)
    here = this_node_id()
    strategy = prepared.strategy
    if strategy is None:
        free = _ray.object_store_free_bytes(here)
        name = select_strategy(manifest.total_bytes, config, free, prepared.registered)
        strategy = get_strategy(name, prepared.registered)()
    # The strategy proves every byte it reads against the scan's stamps, so the
    # manifest's sizes and mtimes are those of the bytes packed.
    transfer_id = uuid.uuid4().hex
    reuse = live is not None and type(strategy) is ChunkedStrategy and prepared.source.is_local
    if reuse:
        assert live is not None
        packed = live.submit(request, transfer_id, submit_plans)
    elif blocking:
        packed = strategy.submit_blocking(request)
    else:
        packed = strategy.submit(request)
    pending = packed.pending
    if not pending and not reuse:  # packed here (else the agent's tasks count the bytes)
        metrics.add_bytes("packed", manifest.total_bytes, strategy.name)
    try:
        if not pending:
            manifest = manifest.with_checksums(packed.checksums)
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
        done = AgentClient(here).call(PackingService.packed, *waits) if pending and waits else None
    except BaseException:
        if live is not None:  # no transfer: nothing of it to offer again
            live.drop([transfer_id])
        raise
    return handle, done


def submit(
    source: Source,
    config: TransferConfig | None = None,
    registered: Registrations | None = None,
    live: LiveChunks | None = None,
    blocking: bool = False,
) -> tuple[TransferHandle, ray.ObjectRef[Any] | None]:
    """``prepare`` then ``start``, on this thread."""
    return start(prepare(source, config, registered), live, blocking)


def _manifest(scanned: Scan, config: TransferConfig) -> Manifest:
    """The manifest of what ``scanned`` lists, its checksums still to come."""
    return Manifest(entries=scanned.entries, chunk_bytes=config.chunk_bytes, chunks=None)
