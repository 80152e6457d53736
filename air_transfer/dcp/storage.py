"""``NodeStorageWriter`` and ``NodeStorageReader``: torch's own ``FileSystemWriter``
and ``FileSystemReader`` over a ``FileSystemBase`` of pyarrow calls (as torch's
``FsspecWriter`` is over fsspec), so planning, file layout (``__<rank>_<n>.distcp``,
``.metadata`` last), deduplication and resharding are DCP's. Each rank's files stream
into node storage and appear only whole; a read fetches only its items' byte ranges
and copies nothing into the caller's tensors until every one is read and decoded.
"""


from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
from collections.abc import Iterator
from typing import IO, Any, TypeVar

import pyarrow.fs as pafs
import torch
from torch.distributed.checkpoint.filesystem import (
    FileSystemBase,
    FileSystemReader,
    FileSystemWriter,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.futures import Future as TorchFuture

from air_transfer.storage.location import node_storage_location
from air_transfer.train import storage_filesystem

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
            if node_storage_location(self.filesystem) is None:
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
