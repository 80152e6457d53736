"""Node storage, the sink: write a transferred checkpoint into a run's storage.

Runs in the agent of the node that writes (``checkpoint_upload_fn`` sends the handle
there): onto that node's own disk through the verified, atomic writer when the
storage is a ``storage_filesystem()`` of this node or a local filesystem, else file
by file through ``pyarrow.fs.copy_files``. Ray Train's reports into node storage
(``store_report``) are written here too, from a worker on any node.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pyarrow.fs as pafs

from air_transfer.cluster.nodes import this_node_id
from air_transfer.config import TransferConfig
from air_transfer.core.confined_dirs import write_beneath
from air_transfer.storage.copy import copy_tree
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


def store_report(
    source: TransferHandle | str,
    root: str,
    path: str,
    config: TransferConfig,
    check: Callable[[], None],
) -> str:
    """Write a Ray Train report's checkpoint to ``path`` of this node's storage
    (confined to ``root``): ``source`` is the transfer of a worker on another node,
    or the directory of a worker on this one (copied from this disk). ``check`` is
    called before each chunk; what it raises ends the write, nothing published."""
    if isinstance(source, str):  # written beneath the held parent (see store_checkpoint)
        return copy_tree(source, path, config, "upload", check, root=root)
    return write_beneath(
        root, path, lambda target: source.write_to(target, check, follow_target=False)
    )
