"""torch Distributed Checkpoint (DCP) straight into node storage, and the Ray Train
recipe around it: the one module that imports torch.

Ray's DCP recipe saves each rank's shard into a local temporary directory, reports
it, and Train copies it into storage; a restore downloads every rank's shards onto
every node before ``dcp.load`` reads its part. Here ``NodeStorageWriter`` streams
each rank's files into a pyarrow filesystem (``storage_filesystem()``: chunked,
checksummed, each file appearing only when closed whole) and writes the metadata
file last, so the reported checkpoint is already in storage; ``NodeStorageReader``
reads only the byte ranges this rank's ``ReadItem``s need, and copies nothing into
the caller's tensors until every one of them has been read and decoded.

    dcp.save(state_dict, storage_writer=NodeStorageWriter("/abs/ckpt"))
    dcp.load(state_dict, storage_reader=NodeStorageReader("/abs/ckpt"))

Inside a Ray Train worker, ``report(state_dict, metrics)`` and ``load(state_dict)``
are the whole recipe. Both classes are torch's own ``FileSystemWriter`` and
``FileSystemReader`` over a ``FileSystemBase`` of pyarrow calls (as torch's
``FsspecWriter`` is over fsspec), so planning, file layout (``__<rank>_<n>.distcp``,
``.metadata``), deduplication and resharding are DCP's.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import io
import os
import posixpath
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import IO, Any, TypeVar

import pyarrow.fs as pafs
import ray.train
import ray.train.collective
import torch
import torch.distributed as dist
from ray.train import Checkpoint, CheckpointUploadMode
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import (
    FileSystemBase,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.futures import Future as TorchFuture

from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.train import storage_filesystem

__all__ = ["NodeStorageReader", "NodeStorageWriter", "load", "report"]

#: DCP's metadata file, written last: a checkpoint without it is incomplete.
METADATA = ".metadata"

T = TypeVar("T")


class ArrowFiles(FileSystemBase):
    """DCP's file operations as calls on a pyarrow filesystem."""

    def __init__(self, filesystem: pafs.FileSystem) -> None:
        self.filesystem = filesystem

    @contextlib.contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Iterator[Any]:
        path = os.fspath(path)
        if "r" in mode:
            with self.filesystem.open_input_file(path) as f:
                yield f
            return
        upload = Upload(self.filesystem.open_output_stream(path))
        try:
            yield upload
        except BaseException:
            upload.abort()
            # Other filesystems publish what they got once the stream is gone.
            if node_storage_handler(self.filesystem) is None:
                with contextlib.suppress(Exception):
                    self.filesystem.delete_file(path)
            raise
        upload.close()

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


class Upload(io.RawIOBase):
    """One file being written: published by ``close``; ``abort`` drops the
    filesystem's stream unclosed, which for node storage discards the upload at
    once (the traceback of the error that caused it holds this, not the stream)."""

    def __init__(self, stream: Any) -> None:
        super().__init__()
        self._stream: Any = stream

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        if self._stream is None:
            raise ValueError("write to a closed or aborted DCP upload")
        return int(self._stream.write(data))

    def tell(self) -> int:
        return int(self._stream.tell()) if self._stream is not None else 0

    def abort(self) -> None:
        self._stream = None  # the last reference: node storage aborts the upload now
        io.RawIOBase.close(self)

    def close(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            stream.close()
        super().close()

    def __del__(self) -> None:
        self.abort()  # dropped unclosed: never published


class NodeStorageWriter(FileSystemWriter):
    """A DCP ``StorageWriter`` into directory ``path`` of ``filesystem`` (default:
    ``storage_filesystem()``, this process's node). Every rank streams its files
    there as DCP produces them; the coordinator writes ``.metadata`` in ``finish``,
    once every rank's files are whole. Usable with ``dcp.save`` and
    ``dcp.async_save`` (it stages the state dict to CPU, as FileSystemWriter does).

    ``sync_files`` is off: node storage publishes a file when it is closed, and an
    ``os.sync()`` of the writer's own node (torch's fallback for a stream without a
    descriptor) would flush the wrong disk.
    """

    def __init__(self, path: str, filesystem: pafs.FileSystem | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("sync_files", False)
        super().__init__(path, **kwargs)
        self.fs = ArrowFiles(filesystem or storage_filesystem())  # type: ignore[assignment]
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return ArrowFiles.validate_checkpoint_id(checkpoint_id)


class NodeStorageReader(FileSystemReader):
    """A DCP ``StorageReader`` of checkpoint directory ``path`` on ``filesystem``
    (default: ``storage_filesystem()``, this process's node).

    Each file is opened once and only the byte ranges of this rank's ``ReadItem``s
    are read from it, in offset order (node storage fetches the chunks that hold
    them, verified). Everything is read and decoded before the first byte is copied
    into the caller's state dict: a missing, truncated or corrupt file raises (naming
    it) with the state dict untouched.
    """

    def __init__(self, path: str, filesystem: pafs.FileSystem | None = None) -> None:
        super().__init__(path)
        # torch's FsspecWriter/Reader swap their FileSystemBase in the same way.
        self.fs = ArrowFiles(filesystem or storage_filesystem())  # type: ignore[assignment]
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return ArrowFiles.validate_checkpoint_id(checkpoint_id)

    def check_complete(self) -> None:
        """Raise FileNotFoundError unless the checkpoint has its metadata file (the
        global one, or rank 0's of a save without collectives)."""
        if not any(self.fs.exists(self._get_metadata_path(rank)) for rank in (None, 0)):
            raise _incomplete(posixpath.join(self.path, METADATA))

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        try:
            metadata: Metadata = super().read_metadata(*args, **kwargs)
        except FileNotFoundError as e:
            raise _incomplete(str(self._get_metadata_path(kwargs.get("rank")))) from e
        return metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> TorchFuture[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            relative = self.storage_data[item.storage_index].relative_path
            per_file.setdefault(relative, []).append(item)
        loaded: list[tuple[ReadItem, Any, torch.Tensor | None]] = []
        for relative, items in per_file.items():
            path = posixpath.join(self.path, relative)
            f: Any
            with self.fs.create_stream(path, "rb") as f:
                size = f.size()
                for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
                    loaded.append(self._read_item(f, path, size, item, planner))
        # Every item is read, decoded and checked: only now is the state dict touched.
        for item, value, target in loaded:
            if target is None:
                planner.load_bytes(item, value)
            else:
                target.copy_(value)
                planner.commit_tensor(item, target)
        done: TorchFuture[None] = TorchFuture()
        done.set_result(None)
        return done

    def _read_item(
        self, f: Any, path: str, size: int, item: ReadItem, planner: LoadPlanner
    ) -> tuple[ReadItem, Any, torch.Tensor | None]:
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
        data = f.read_at(info.length, info.offset)
        raw: IO[bytes] = io.BytesIO(memoryview(data))
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


def _incomplete(path: str) -> FileNotFoundError:
    return FileNotFoundError(
        errno.ENOENT,
        "no DCP metadata file: the checkpoint is incomplete (its save did not finish) "
        "or this is not a torch.distributed.checkpoint directory; restore from another",
        path,
    )


def _unwrapped(call: Callable[[], T]) -> T:
    """``call()``, raising the error a rank raised (this rank's if it failed) rather
    than DCP's CheckpointException, a BaseException that ``except Exception`` misses."""
    try:
        return call()
    except CheckpointException as e:
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        failed, _ = e.failures.get(rank) or next(iter(e.failures.values()))
        if not isinstance(failed, Exception):
            raise
        raise copy.copy(failed) from e


# -- the Ray Train recipe ----------------------------------------------------------------
_lock = threading.Lock()
_pending: Future[Any] | None = None  # this worker's async save still running
_async_group: Any = None  # the process group async saves run their collectives on


def report(
    state_dict: dict[str, Any],
    metrics: dict[str, Any],
    *,
    async_save: bool = False,
    checkpoint_dir_name: str | None = None,
) -> None:
    """In a Ray Train worker (every rank calls it): DCP-save ``state_dict`` into this
    report's checkpoint directory of the run's storage and report it with
    ``metrics``. The checkpoint is written where Train keeps it, so it is reported
    as it is (``NO_UPLOAD``): no local copy, no upload.

    ``async_save``: block only while the state dict is staged (copied to CPU); the
    save goes on in the background, on a process group of its own (training's
    collectives go on meanwhile), and the report follows once it is complete. A
    later save waits for this one first.
    """
    global _pending
    wait_for_pending_save()
    storage = ray.train.get_context().get_storage()
    name = checkpoint_dir_name or ray.train.collective.broadcast_from_rank_zero(
        storage.make_default_checkpoint_dir_name()
    )
    path = storage.build_checkpoint_path_from_name(name)
    checkpoint = Checkpoint(path, filesystem=storage.storage_filesystem)
    writer = NodeStorageWriter(path, storage.storage_filesystem)
    if not async_save:
        _unwrapped(lambda: state_dict_saver.save(state_dict, storage_writer=writer))
        ray.train.report(
            metrics,
            checkpoint=checkpoint,
            checkpoint_dir_name=name,
            checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD,
        )
        return
    started = _unwrapped(
        lambda: state_dict_saver.async_save(
            state_dict, storage_writer=writer, process_group=_save_group()
        )
    )
    future = started.upload_completion if isinstance(started, AsyncSaveResponse) else started
    with _lock:
        _pending = future

    def saved(checkpoint: Checkpoint, _name: str) -> Checkpoint:
        _unwrapped(future.result)
        return checkpoint

    ray.train.report(
        metrics,
        checkpoint=checkpoint,
        checkpoint_dir_name=name,
        checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
        checkpoint_upload_fn=saved,
        delete_local_checkpoint_after_upload=False,  # it is the stored checkpoint
    )


def wait_for_pending_save() -> None:
    """Wait until this worker's async save (if any) is complete; raise its error."""
    global _pending
    with _lock:
        pending, _pending = _pending, None
    if pending is not None:
        _unwrapped(pending.result)


def _save_group() -> Any:
    """A gloo group for async saves (None without a process group): DCP's
    collectives on the training group, from another thread, could interleave with
    the training loop's own and deadlock it. Made once; every rank makes it at its
    first async report, in step."""
    global _async_group
    if not (dist.is_available() and dist.is_initialized()):
        return None
    if _async_group is None:
        _async_group = dist.new_group(backend="gloo")
    return _async_group


def load(state_dict: dict[str, Any], checkpoint: Checkpoint | None = None) -> bool:
    """Load this rank's part of ``checkpoint`` (default: the latest reported one,
    ``ray.train.get_checkpoint()``) into ``state_dict`` in place, tensors and other
    values alike; False when there is none. Raises FileNotFoundError for a
    checkpoint without its metadata file, and what reading raised (ChecksumError,
    truncated shard...) with ``state_dict`` untouched."""
    if checkpoint is None:
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return False
    reader = NodeStorageReader(checkpoint.path, checkpoint.filesystem)
    reader.check_complete()
    _unwrapped(lambda: dcp_load(state_dict, storage_reader=reader))
    return True
