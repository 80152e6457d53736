"""Node storage, the caller's side of an incremental store: checksums first, then
only the chunks the storage node lacks.

The caller scans its checkpoint directory and has its node's agent take a checksum
of every per-file chunk (``core.file_chunks``: proven reads, no byte moved); it sends
those to the storage node's agent, which reuses what earlier checkpoints hold there
and has this node's agent pack the rest (``storage.server.incremental``). The
directory must stay unchanged until the call returns: a file changed meanwhile is a
SourceChangedError, nothing published.
"""

from __future__ import annotations

import pyarrow.fs as pafs
from ray.exceptions import ObjectLostError, RayActorError

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.fetch import fresh, get
from air_transfer.cluster.nodes import this_node_id
from air_transfer.core.file_chunks import ChunkedFiles, file_chunk_plans
from air_transfer.core.manifest import Manifest
from air_transfer.core.scan import Source, scan
from air_transfer.errors import CheckpointLostError
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import NodeCheckpoints, SenderOffer
from air_transfer.transfer.agent_tasks import task_groups
from air_transfer.transfer.packing_service import PackingService


def chunked_files(directory: str, chunk_bytes: int) -> tuple[Source, ChunkedFiles] | None:
    """``directory`` (on this node) scanned and its per-file chunks checksummed by
    this node's agent; None if it holds a symlink (stored the usual way)."""
    source = Source(pafs.LocalFileSystem(), directory)
    scanned = scan(source, follow_symlinks=False)
    if any(e.kind == "symlink" for e in scanned.entries):
        return None
    plans = list(file_chunk_plans(scanned.files, scanned.stamps, chunk_bytes))
    agent = AgentClient()
    refs = [
        ref
        for group in task_groups(plans)
        for ref in agent.calls(len(group), PackingService.checksum_chunks, source, group)
    ]
    checksums = []
    for ref in refs:
        try:
            checksum = get(ref)
        except (RayActorError, ObjectLostError) as e:
            raise CheckpointLostError(
                f"this node's air-transfer agent died while it took the checksums of "
                f"{directory!r} ({type(e).__name__}); nothing was stored: report again"
            ) from None
        if isinstance(checksum, BaseException):  # the packing error, as a value
            raise fresh(checksum)
        checksums.append(checksum)
    manifest = Manifest(scanned.entries, chunk_bytes, None)
    return source, ChunkedFiles(manifest, scanned.stamps, tuple(checksums))


def store_incremental(
    link: AgentLink, directory: str, path: str, worker: str | None = None
) -> dict[str, int] | None:
    """Store the checkpoint ``directory`` (on this node) at ``path`` of ``link``'s
    node storage, sending only what the storage node does not hold; what it cost
    (``storage.server.incremental.STATS``), or None for a directory holding a
    symlink, which is not stored here. ``worker``: the Ray Train worker whose
    report this is (noted as ``store_report`` notes it)."""
    described = chunked_files(directory, link.config.chunk_bytes)
    if described is None:
        return None
    source, files = described
    offer = SenderOffer(source, this_node_id(), files)
    return link.call(NodeCheckpoints.store_incremental, worker, link.root, path, offer, link.config)
