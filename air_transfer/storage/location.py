"""Where a node storage filesystem keeps its files: the storage node and the root.

Both rooms of node storage need to recognise one of its filesystems: the caller's
side makes it, and the storage node's sink writes straight to disk when a run's
storage is a node storage of its own node. This is the one thing they share, so that
neither imports the other.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow.fs as pafs


@dataclass(frozen=True)
class NodeStorageLocation:
    """The node whose disk holds the files, and their root there."""

    node_id: str
    root: str


def node_storage_location(fs: object) -> NodeStorageLocation | None:
    """The location of ``fs`` if it is a node storage filesystem, else None."""
    handler = getattr(fs, "handler", None) if isinstance(fs, pafs.PyFileSystem) else None
    location = getattr(handler, "location", None)
    return location if isinstance(location, NodeStorageLocation) else None
