"""The storage node's disk services without the actor around them."""

from __future__ import annotations

from air_transfer.storage.server.metadata import DiskStorage
from air_transfer.storage.server.uploads import DiskUploads


class Disk(DiskStorage, DiskUploads):
    """The disk services the node agent runs, minus the actor."""
