"""Which checkpoint a restart restores from node storage with a durable tier: the newest
one that is whole, never one the tier holds with a file missing, cut short or replaced
(Megatron-LM#5281 looped 44 restarts on a broken copy for want of this check).

A checkpoint node storage holds is whole (node storage publishes a checkpoint
directory whole). One only the durable tier holds is whole when its manifests are all
there and each object they name is there as the drain confirmed it (``durable_whole``:
a HEAD each). A checkpoint that is not is passed over with a warning naming it and
why; if none is whole, the newest is kept, and its restore fails naming the file.
"""

from __future__ import annotations

import logging

import pyarrow.fs as pafs

from air_transfer.storage.client.handler import NodeStorageHandler, node_storage_handler

logger = logging.getLogger(__name__)


def newest_whole(filesystem: pafs.FileSystem, newest_first: list[str]) -> str | None:
    """The first of ``newest_first`` (checkpoint paths of ``filesystem``) that is
    whole (see the module); the first itself where none is, or where ``filesystem``
    is not node storage with a durable tier."""
    handler = node_storage_handler(filesystem)
    if handler is None or handler.durable is None or not newest_first:
        return newest_first[0] if newest_first else None
    broken: list[tuple[str, str]] = []
    for path in newest_first:
        whole, why = _whole(handler, path)
        if whole:
            if broken:
                logger.warning(
                    "air-transfer: restoring checkpoint %s, the newest that is whole: %s",
                    path, "; ".join(f"{p} is not ({w})" for p, w in broken),
                )  # fmt: skip
            return path
        broken.append((path, why))
    logger.warning(
        "air-transfer: no checkpoint of this run is whole in the durable tier %s (%s); "
        "the newest is restored, and its restore names what is missing",
        handler.durable.uri, "; ".join(f"{p}: {w}" for p, w in broken),
    )  # fmt: skip
    return newest_first[0]


def _whole(handler: NodeStorageHandler, path: str) -> tuple[bool, str]:
    if handler.copies_holding(path) > 0:
        return True, ""
    return handler.durable_whole(path)
