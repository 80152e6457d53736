"""``NodeStorageReader``: torch's own ``FileSystemReader`` over ``ArrowFiles`` that
reads only the byte ranges of this rank's ``ReadItem``s and copies nothing into the
caller's tensors until every one of them has been read and decoded.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
from collections.abc import Iterator
from typing import IO, Any, cast

import pyarrow as pa
import pyarrow.fs as pafs
import torch
from torch.distributed.checkpoint.filesystem import (
    FileSystemReader,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    ReadItem,
)
from torch.futures import Future as TorchFuture

from air_transfer.dcp.arrow_files import METADATA, ArrowFiles, files_at
from air_transfer.dcp.staging import StagedTensors, ViewReader, staging_file


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
        path, files = files_at(type(self).__name__, path, filesystem)
        super().__init__(path)
        self.fs, self.path = files, files.init_path(path)  # type: ignore[assignment]

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


def _incomplete(path: str) -> FileNotFoundError:
    return FileNotFoundError(
        errno.ENOENT,
        "no DCP metadata file: the checkpoint is incomplete (its save did not finish) "
        "or this is not a torch.distributed.checkpoint directory; restore from another",
        path,
    )
