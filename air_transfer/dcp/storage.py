"""``NodeStorageWriter`` and ``NodeStorageReader``: torch's own ``FileSystemWriter``
and ``FileSystemReader`` over a ``FileSystemBase`` of pyarrow calls (as torch's
``FsspecWriter`` is over fsspec), so planning, file layout (``__<rank>_<n>.distcp``,
``.metadata`` last), deduplication and resharding are DCP's. Each rank's files stream
into node storage and appear only whole; a read fetches only its items' byte ranges
and copies nothing into the caller's tensors until every one is read and decoded.
A file streamed into node storage, which checksums every chunk, is written without
``torch.save``'s crc32 of each record (``dcp.crc``: a third of a save's CPU).

A save into a directory that already holds a checkpoint never writes over the files
its metadata names: its own files get names of their own (``__<rank>_<tag>_<n>``),
and its metadata replaces the old one in one rename, after which the files only the
old one named are deleted. A save that dies before that rename leaves the old
checkpoint whole (its files are untouched), never old metadata over new files.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import io
import logging
import os
import pickle
import posixpath
import uuid
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any, TypeVar, cast

import pyarrow as pa
import pyarrow.fs as pafs
import ray
import torch
from torch.distributed.checkpoint.filesystem import (
    FileSystemBase,
    FileSystemReader,
    FileSystemWriter,
    _StoragePrefix,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
)
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future as TorchFuture

from air_transfer.cluster.nodes import live_node_ids
from air_transfer.core.confine import storage_path
from air_transfer.dcp.crc import without_crc32
from air_transfer.dcp.staging import StagedTensors, ViewReader, staging_file
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from air_transfer.storage.location import node_storage_location
from air_transfer.storage.node_api import NodeCheckpoints
from air_transfer.train import run_storage_filesystem, storage_filesystem

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

#: DCP's metadata file, written last: a checkpoint without it is incomplete.
METADATA = ".metadata"

T = TypeVar("T")
logger = logging.getLogger(__name__)


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


class NodeStorageWriter(FileSystemWriter):
    """A DCP ``StorageWriter`` into directory ``path`` of ``filesystem``. Without
    one: in a Ray Train worker, the run's storage (``RunConfig``); in a one-node Ray
    cluster, node storage of this node; elsewhere ValueError (which node's disk
    would be a guess: pass ``filesystem=storage_filesystem(node=...)``, made once on
    the driver and handed to every rank). Every rank streams its files
    there as DCP produces them; the coordinator writes ``.metadata`` in ``finish``,
    once every rank's files are whole. Usable with ``dcp.save`` and
    ``dcp.async_save`` (it stages the state dict to CPU, as FileSystemWriter does).

    ``sync_files`` is off: node storage publishes a file when it is closed, and an
    ``os.sync()`` of the writer's own node (torch's fallback for a stream without a
    descriptor) would flush the wrong disk.
    """

    def __init__(self, path: str, filesystem: pafs.FileSystem | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("sync_files", False)
        if filesystem is None:
            path = os.path.abspath(path)
        super().__init__(path, **kwargs)
        chosen = filesystem or default_filesystem(type(self).__name__, path)
        self.fs = ArrowFiles(chosen)  # type: ignore[assignment]
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether DCP may use this writer for ``checkpoint_id``: a path, not a URL."""
        return ArrowFiles.validate_checkpoint_id(checkpoint_id)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """DCP's plans (``__<rank>_`` file prefixes); where a checkpoint is already
        there, each prefix with a tag of this save, so that none of its files is
        named as a file of that checkpoint (see the module).

        Args:
            plans: Every rank's plan, as DCP's coordinator gathers them.

        Returns:
            The plans, their file prefixes tagged where a checkpoint is there.
        """
        plans = super().prepare_global_plan(plans)
        if not self.fs.exists(self._own_metadata_path()):
            return plans
        tag = uuid.uuid4().hex[:8]
        return [
            dataclasses.replace(p, storage_data=_StoragePrefix(f"{p.storage_data.prefix}{tag}_"))
            for p in plans
        ]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Publish the metadata by renaming it over the one in place (torch removes
        that one first: a save dying in between would leave no checkpoint at all),
        then delete the files only the replaced one named.

        Args:
            metadata: DCP's metadata of the save.
            results: Every rank's write results.
        """
        path = self._own_metadata_path()
        replaced = self._files_named_by(path)
        fs = cast(ArrowFiles, self.fs)  # where torch's FileSystemWriter has its own
        self.fs = _KeepUntilRenamedOver(fs.filesystem, path)  # type: ignore[assignment]
        try:
            super().finish(metadata, results)
        finally:
            self.fs = fs  # type: ignore[assignment]
        kept = {r.storage_data.relative_path for wrs in results for r in wrs}
        for relative in sorted(replaced - kept):
            try:
                self.fs.rm_file(self.fs.concat_path(self.path, relative))
            except FileNotFoundError:
                pass
            except Exception as e:  # the new checkpoint is whole: only space is lost
                logger.warning(
                    "air-transfer: could not delete %s of the checkpoint %s replaced (%s: %s)",
                    relative,
                    self.path,
                    type(e).__name__,
                    e,
                )

    def _own_metadata_path(self) -> str:
        """The metadata file this save publishes (a rank's own without collectives)."""
        rank = self.rank if not self.use_collectives else None
        return str(self._get_metadata_path(rank))

    def _files_named_by(self, path: str) -> set[str]:
        """The files the metadata at ``path`` names (none if there is none, or it
        cannot be read: then nothing is deleted)."""
        try:
            with self.fs.create_stream(path, "rb") as f:
                old = pickle.load(f)
            return {info.relative_path for info in old.storage_data.values()}
        except FileNotFoundError:
            return set()
        except Exception as e:
            logger.warning(
                "air-transfer: the metadata %s being replaced cannot be read (%s: %s); the "
                "files it names are kept",
                path,
                type(e).__name__,
                e,
            )
            return set()


class _KeepUntilRenamedOver(ArrowFiles):
    """``ArrowFiles`` on which removing ``keep`` does nothing: the rename that torch's
    ``finish`` makes next replaces it in one step (every pyarrow ``move`` over a file
    does), so the old metadata stays until the new one is in its place."""

    def __init__(self, filesystem: pafs.FileSystem, keep: str) -> None:
        super().__init__(filesystem)
        self.keep = keep

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        if os.fspath(path) != self.keep:
            super().rm_file(path)


def report_writer(path: str, filesystem: pafs.FileSystem, worker: str) -> NodeStorageWriter:
    """The writer of a Ray Train report's checkpoint ``path``, saved by Train worker
    ``worker`` (its actor id): its directory is noted as that worker's report."""
    writer = NodeStorageWriter(path, filesystem)
    writer.fs = ReportFiles(filesystem, worker)  # type: ignore[assignment]
    return writer


class NodeStorageReader(FileSystemReader):
    """A DCP ``StorageReader`` of checkpoint directory ``path`` on ``filesystem``
    (without one: as for ``NodeStorageWriter``, the run's storage in a Ray Train
    worker, else ValueError unless the cluster has one node).

    Each file is opened once and only the byte ranges of this rank's ``ReadItem``s
    are read from it, in offset order (node storage fetches the chunks that hold
    them, verified). Everything is read and decoded before the first byte is copied
    into the caller's state dict: a missing, truncated or corrupt file raises (naming
    it) with the state dict untouched.
    """

    def __init__(self, path: str, filesystem: pafs.FileSystem | None = None) -> None:
        if filesystem is None:
            path = os.path.abspath(path)
        super().__init__(path)
        chosen = filesystem or default_filesystem(type(self).__name__, path)
        # torch's FsspecWriter/Reader swap their FileSystemBase in the same way.
        self.fs = ArrowFiles(chosen)  # type: ignore[assignment]
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether DCP may use this reader for ``checkpoint_id``: a path, not a URL."""
        return ArrowFiles.validate_checkpoint_id(checkpoint_id)

    def check_complete(self) -> None:
        """Raise FileNotFoundError unless the checkpoint has its metadata file (the
        global one, or rank 0's of a save without collectives)."""
        if not any(self.fs.exists(self._get_metadata_path(rank)) for rank in (None, 0)):
            raise _incomplete(posixpath.join(self.path, METADATA))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        """DCP's metadata of the checkpoint.

        Returns:
            It, as torch's ``FileSystemReader`` reads it.

        Raises:
            FileNotFoundError: There is none: the checkpoint is incomplete.
        """
        try:
            metadata: Metadata = super().read_metadata(*args, **kwargs)
        except FileNotFoundError as e:
            raise _incomplete(str(self._get_metadata_path(kwargs.get("rank")))) from e
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture[None]:
        """Read this rank's items of ``plan``, each file once, its ranges in offset
        order, and stage each decoded tensor in an unlinked file on this node's disk
        (``TMPDIR``); only once every item is read, verified and decoded is the state
        dict written, from that file. So a failed load leaves the state dict as it was,
        and memory holds one decoded tensor and the read window at a time (as torch's
        own reader does) rather than the rank's whole share; the disk holds the share
        until the load returns.

        Args:
            plan: This rank's load plan.
            planner: DCP's load planner, which receives each item.

        Returns:
            A completed torch future (the reading is done when it returns).

        Raises:
            ChecksumError: A byte range read back differs from what was written.
            OSError: ``TMPDIR`` has no room for the rank's share (naming it).
        """
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            relative = self.storage_data[item.storage_index].relative_path
            per_file.setdefault(relative, []).append(item)
        with staging_file() as staging, contextlib.closing(StagedTensors(staging)) as staged:
            values: list[tuple[ReadItem, io.BytesIO]] = []
            for relative, items in per_file.items():
                for item, value, target in self._decoded(relative, items, planner):
                    if isinstance(value, io.BytesIO):
                        values.append((item, value))
                    else:
                        assert target is not None
                        staged.add(item, value, target)
                    del value
            # Every item is read, decoded, checked and staged (the last tensor's write
            # too): only now is the state dict touched.
            staged.finish()
            for item, value in values:
                planner.load_bytes(item, value)
            staged.copy_out(planner)
        done: TorchFuture[None] = TorchFuture()
        done.set_result(None)
        return done

    def _decoded(
        self, relative: str, items: list[ReadItem], planner: LoadPlanner
    ) -> Iterator[tuple[ReadItem, torch.Tensor | io.BytesIO, torch.Tensor | None]]:
        """``items`` of file ``relative``, read once in offset order and decoded one
        at a time (see ``_read_item``)."""
        path = posixpath.join(self.path, relative)
        f: pa.NativeFile
        with self.fs.create_stream(path, "rb") as f:
            size = f.size()
            for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
                yield self._read_item(f, path, size, item, planner)

    def _read_item(
        self, f: pa.NativeFile, path: str, size: int, item: ReadItem, planner: LoadPlanner
    ) -> tuple[ReadItem, torch.Tensor | io.BytesIO, torch.Tensor | None]:
        """``item``'s bytes from ``f``, decoded: (item, BytesIO, None) for a
        non-tensor value, (item, tensor, its destination) for a tensor."""
        info = self.storage_data[item.storage_index]
        end = info.offset + info.length
        if end > size:
            raise OSError(
                errno.EIO,
                f"truncated DCP shard: {item.storage_index.fqn!r} needs bytes "
                f"{info.offset}..{end}, the file has {size}; save the checkpoint again",
                path,
            )
        f.seek(info.offset)
        data = f.read_buffer(info.length)  # node storage: a view of the chunk, no copy
        raw = cast(IO[bytes], ViewReader(memoryview(data)))
        del data
        stream = self.transforms.transform_load_stream(item, info.transform_descriptors or (), raw)
        if item.type == LoadItemType.BYTE_IO:
            body = stream.read()
            torch.load(io.BytesIO(body), weights_only=False)  # fails now, not half-way
            return item, io.BytesIO(body), None
        if not stream.seekable():
            stream = io.BytesIO(stream.read())
        tensor = torch.load(stream, map_location="cpu", weights_only=True)
        for dim, (start, length) in enumerate(zip(item.storage_offsets, item.lengths, strict=True)):
            tensor = tensor.narrow(dim, start, length)
        target = planner.resolve_tensor(item).detach()
        if target.size() != tensor.size():
            raise ValueError(
                f"{item.storage_index.fqn!r} in {path!r}: the checkpoint holds a "
                f"{tuple(tensor.size())} slice where the state dict has "
                f"{tuple(target.size())}"
            )
        return item, tensor, target


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


def _incomplete(path: str) -> FileNotFoundError:
    return FileNotFoundError(
        errno.ENOENT,
        "no DCP metadata file: the checkpoint is incomplete (its save did not finish) "
        "or this is not a torch.distributed.checkpoint directory; restore from another",
        path,
    )
