"""DCP's file operations over a pyarrow filesystem: ``ArrowFiles``, the
``FileSystemBase`` that torch's ``FileSystemWriter`` and ``FileSystemReader`` call
(as torch's ``FsspecFileSystem`` is over fsspec), its Ray Train report variant
(``ReportFiles``: the directory noted as the worker's report) and the write stream
each file goes through (``Upload``: a file appears only when closed whole; dropped
unclosed, it is never published).
"""

from __future__ import annotations

import contextlib
import io
import os
import posixpath
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.fs as pafs
import ray
from torch.distributed.checkpoint.filesystem import (
    FileSystemBase,
)

from air_transfer.cluster.nodes import live_node_ids
from air_transfer.core.confine import storage_path
from air_transfer.dcp.crc import without_crc32
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.location import node_storage_location
from air_transfer.storage.node_api import NodeCheckpoints
from air_transfer.train import run_storage_filesystem, storage_filesystem

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

#: DCP's metadata file, written last: a checkpoint without it is incomplete.
METADATA = ".metadata"


class ArrowFiles(FileSystemBase):
    """DCP's file operations as calls on a pyarrow filesystem."""

    def __init__(self, filesystem: pafs.FileSystem) -> None:
        self.filesystem = filesystem

    @contextlib.contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Iterator[pa.NativeFile | Upload]:
        path = os.fspath(path)
        if "r" in mode:
            with self.filesystem.open_input_file(path) as f:
                yield f
            return
        upload = Upload(self.filesystem.open_output_stream(path))
        node_storage = node_storage_location(self.filesystem) is not None
        try:  # node storage checksums chunk by chunk: torch's crc32 is not needed
            with without_crc32() if node_storage else contextlib.nullcontext():
                yield upload
            upload.close()
        except BaseException:
            upload.abort()
            # Other filesystems publish what they got once the stream is gone.
            if not node_storage:
                with contextlib.suppress(Exception):
                    self.filesystem.delete_file(path)
            failed = upload.failure
            if isinstance(failed, OSError):  # torch's own error would be a symptom of it
                raise _not_stored(failed, path) from None
            raise

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return posixpath.join(os.fspath(path), suffix)

    def init_path(self, path: str | os.PathLike[str]) -> str:
        return os.fspath(path)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        self.filesystem.move(os.fspath(path), os.fspath(new_path))

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        self.filesystem.create_dir(os.fspath(path), recursive=True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike)) and "://" not in str(checkpoint_id)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        [info] = self.filesystem.get_file_info([os.fspath(path)])
        return bool(info.type != pafs.FileType.NotFound)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.filesystem.delete_file(os.fspath(path))


class ReportFiles(ArrowFiles):
    """``ArrowFiles`` of a Ray Train report's checkpoint that Train worker ``worker``
    writes itself: in node storage its directory is made by the storage node's agent,
    which notes it under the worker, so that a round Train stops before it tracks
    the checkpoint (a rank failed mid-save) leaves nothing in storage
    (``train.hooks.reclaim_reports``). Replicated storage makes it as any directory."""

    def __init__(self, filesystem: pafs.FileSystem, worker: str) -> None:
        super().__init__(filesystem)
        self.worker = worker

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        handler = node_storage_handler(self.filesystem)
        if handler is None or isinstance(handler, ReplicatedHandler) or not self.worker:
            super().mkdir(path)
            return
        root, local, worker = handler.root, storage_path(handler.root, os.fspath(path)), self.worker
        handler.link.call(NodeCheckpoints.note_report_dir, root, worker, local)


class Upload(io.RawIOBase):
    """One file being written: published by ``close``; ``abort`` drops the
    filesystem's stream unclosed, which for node storage discards the upload at
    once (the traceback of the error that caused it holds this, not the stream)."""

    def __init__(self, stream: pa.NativeFile) -> None:
        super().__init__()
        self._stream: pa.NativeFile | None = stream
        #: What the filesystem's stream raised, if it did: torch.save does not pass a
        #: failed write on (it fails later on a position that does not add up).
        self.failure: BaseException | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Buffer) -> int:
        if self._stream is None:
            raise ValueError("write to a closed or aborted DCP upload")
        try:
            return int(self._stream.write(data))
        except BaseException as e:
            self.failure = self.failure or e
            raise

    def tell(self) -> int:
        return int(self._stream.tell()) if self._stream is not None else 0

    def abort(self) -> None:
        self._stream = None  # the last reference: node storage aborts the upload now
        io.RawIOBase.close(self)

    def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            try:
                stream.close()
            except BaseException as e:
                self.failure = self.failure or e
                raise
        super().close()

    def __del__(self) -> None:
        self.abort()  # dropped unclosed: never published


class KeepUntilRenamedOver(ArrowFiles):
    """``ArrowFiles`` on which removing ``keep`` does nothing: the rename that torch's
    ``finish`` makes next replaces it in one step (every pyarrow ``move`` over a file
    does), so the old metadata stays until the new one is in its place."""

    def __init__(self, filesystem: pafs.FileSystem, keep: str) -> None:
        super().__init__(filesystem)
        self.keep = keep

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        if os.fspath(path) != self.keep:
            super().rm_file(path)


def _not_stored(failed: OSError, path: str) -> OSError:
    """What a file's write or commit raised (the storage node's agent died: a
    ConnectionError), saying that nothing of the file was stored."""
    said = str(failed) if failed.errno is None else failed.strerror
    message = (
        f"{said}; nothing of the DCP file {path!r} was stored, and the checkpoint is not "
        "complete: save it again"
    )
    if failed.errno is None:
        return type(failed)(message)
    return type(failed)(failed.errno, message, path)


def files_at(what: str, path: str, filesystem: pafs.FileSystem | None) -> tuple[str, ArrowFiles]:
    """Where ``what`` (a writer or a reader) of ``path`` works: ``path`` (made
    absolute when no filesystem is given) and the ``ArrowFiles`` of ``filesystem``
    (``default_filesystem`` without one). torch's ``FsspecWriter`` and
    ``FsspecReader`` swap their ``FileSystemBase`` in the same way."""
    if filesystem is None:
        path = os.path.abspath(path)
        filesystem = default_filesystem(what, path)
    return path, ArrowFiles(filesystem)


def default_filesystem(what: str, path: str) -> pafs.FileSystem:
    """Where ``what`` (a writer or a reader of ``path``, absolute) works without a
    filesystem: the Train run's storage in a Ray Train worker; in a one-node cluster,
    node storage of this node rooted at ``path``. Anywhere else it would be a guess
    (each rank's own node, so shards scatter and only a restore fails): ValueError
    naming the fix."""
    run = run_storage_filesystem()
    if run is not None:
        return run
    fix = (
        f"make one filesystem on the driver, e.g. fs = air_transfer.storage_filesystem"
        f'(node="head"), hand it to every rank and pass it: {what}({path!r}, fs) '
        "(inside Ray Train the run's storage is the default)"
    )
    if not ray.is_initialized():
        raise ValueError(f"{what}({path!r}) without a filesystem needs Ray running; {fix}")
    nodes = len(live_node_ids())
    if nodes > 1:
        raise ValueError(
            f"{what}({path!r}) needs a filesystem outside Ray Train: this Ray cluster has "
            f"{nodes} live nodes and each rank would write to, or read from, its own "
            f"node's disk; {fix}"
        )
    return storage_filesystem(root=path)
