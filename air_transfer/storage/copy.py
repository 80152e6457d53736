"""A checkpoint directory copied on one node's disk as a transfer would write it, for
node storage's own node: Ray Train's reports and restores there, and the storage
agent's copy of a report made on its node. Shared by both rooms of node storage,
like ``location``: the bytes never leave the process, so there is no object store to
cross and no checksum to take.
"""

from __future__ import annotations

from collections.abc import Callable

import pyarrow.fs as pafs

from air_transfer.config import TransferConfig
from air_transfer.core.confined_dirs import ConfinedSource, write_beneath
from air_transfer.core.manifest import Manifest
from air_transfer.core.readahead import read_chunks_ahead
from air_transfer.core.scan import Source, scan
from air_transfer.core.writer import checked_chunks, write_tree
from air_transfer.observe.metrics import Phase
from air_transfer.observe.telemetry import NODE_STORAGE, Transfer, describe


def copy_tree(
    source: str,
    target: str,
    config: TransferConfig,
    phase: Phase = "download",
    check: Callable[[], None] | None = None,
    *,
    root: str | None = None,
) -> str:
    """Copy the checkpoint directory ``source`` to ``target`` on this node, as a
    transfer would write it: every byte read between checks of its file against the
    scan (a file changed meanwhile is a SourceChangedError), large files written
    around the page cache, the target published whole (merged into an existing
    directory in one step). For Ray Train's uploads and downloads on the storage node:
    the bytes never leave this process, so there is no object store to cross and no
    checksum to take. Counted as a transfer of ``phase`` (``upload`` for a report,
    ``download`` for a restore) of node storage.

    ``root``: the storage root, which the storage side of the copy (the ``target`` of
    an upload, the ``source`` of a download) is confined to (``core.confined_dirs``).
    ``check`` is called before each chunk; what it raises ends the copy, nothing
    published."""
    upload = phase == "upload"
    src = (
        ConfinedSource(pafs.LocalFileSystem(), source, storage_root=root)
        if root is not None and not upload
        else Source(pafs.LocalFileSystem(), source)
    )
    scanned = scan(src, follow_symlinks=config.follow_symlinks)
    manifest = Manifest(scanned.entries, config.chunk_bytes, None)
    transfer = Transfer(
        phase,
        strategy=NODE_STORAGE,
        total=manifest.total_bytes,
        desc=describe(source if upload else target, "copy"),
        progress=config.progress,
    )
    with transfer:
        chunks = read_chunks_ahead(
            src, scanned.files, scanned.stamps, config.chunk_bytes, checksums=False
        )
        views = transfer.chunks(
            (view for _, view, _ in chunks), manifest.chunk_length, verified=False
        )

        def write(into: str, follow: bool = True) -> str:
            return write_tree(
                manifest, checked_chunks(views, check), into, verify=False,
                direct_io=config.direct_io, follow_target=follow,
            )  # fmt: skip

        try:
            if root is not None and upload:
                return write_beneath(root, target, lambda into: write(into, False))
            return write(target)
        finally:
            views.close()
            chunks.close()  # type: ignore[attr-defined]
