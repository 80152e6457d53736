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

from air_transfer.config import TransferConfig
from air_transfer.fs import payload_filesystem
from air_transfer.handle import TransferHandle
from air_transfer.nodes import this_node_id
from air_transfer.storage.confine import checked_path
from air_transfer.storage.handler import node_storage_handler
from air_transfer.storage.same_node import copy_tree


def store_checkpoint(handle: TransferHandle, filesystem: pafs.FileSystem, path: str) -> str:
    """Write ``handle``'s checkpoint to ``path`` on ``filesystem`` from this process:
    through the atomic, verified writer when the path is on this node's disk, else
    file by file through pyarrow."""
    handler = node_storage_handler(filesystem)
    if handler is not None and handler.node_id == this_node_id():
        # Checked now, then handed to the writer by path: a directory on the way
        # swapped for a symlink out of the root in between would lead the write out
        # (the writer resolves the target as it finds it; see storage.confine).
        return handle.write_to(checked_path(handler.root, path))
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
    target = checked_path(root, path)  # see store_checkpoint
    if isinstance(source, str):
        return copy_tree(source, target, config, "upload", check)
    return source.write_to(target, check)
