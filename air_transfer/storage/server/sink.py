"""Node storage, the sink: write a transferred checkpoint into a run's storage.

Runs in the agent of the node that writes (``checkpoint_upload_fn`` sends the handle
there): onto that node's own disk through the verified, atomic writer when the
storage is a ``storage_filesystem()`` of this node or a local filesystem, else file
by file through ``pyarrow.fs.copy_files``.
"""

from __future__ import annotations

import os

import pyarrow.fs as pafs

from air_transfer.cluster.nodes import this_node_id
from air_transfer.core.confined import write_beneath
from air_transfer.storage.location import node_storage_location
from air_transfer.transfer.fs_view import payload_filesystem
from air_transfer.transfer.handle import TransferHandle


def store_checkpoint(handle: TransferHandle, filesystem: pafs.FileSystem, path: str) -> str:
    """Write ``handle``'s checkpoint to ``path`` on ``filesystem`` from this process:
    through the atomic, verified writer when the path is on this node's disk, else
    file by file through pyarrow."""
    location = node_storage_location(filesystem)
    if location is not None and location.node_id == this_node_id():
        # Written through the target's parent held open, confined: never by a path
        # resolved again, which a directory swapped for a symlink could lead out.
        return write_beneath(
            location.root, path, lambda target: handle.write_to(target, follow_target=False)
        )
    if isinstance(filesystem, pafs.LocalFileSystem):
        return handle.write_to(os.path.abspath(path))
    filesystem.create_dir(path, recursive=True)
    pafs.copy_files(
        "/", path, source_filesystem=payload_filesystem(handle), destination_filesystem=filesystem
    )
    return path
