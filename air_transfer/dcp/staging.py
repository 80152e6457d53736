"""Where a DCP load keeps what it has decoded until it writes the state dict
(``NodeStorageReader.read_data``): each tensor in an unlinked file in ``TMPDIR``,
so that a failed load leaves the state dict untouched without holding the rank's
whole share in memory; and a seekable view of a byte range for ``torch.load``.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future
from typing import IO, TYPE_CHECKING

import torch
from torch.distributed.checkpoint.planner import LoadPlanner, ReadItem

from air_transfer.core.reader import SeekableReader
from air_transfer.core.threads import pool

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


@contextlib.contextmanager
def staging_file() -> Iterator[IO[bytes]]:
    """An unlinked file in ``TMPDIR`` for a load's decoded tensors (gone once
    closed, or if the process dies)."""
    try:
        staging = tempfile.TemporaryFile(prefix="air-transfer-dcp-load-")
    except OSError as e:
        raise not_staged(e, 0) from None
    with staging:
        yield staging


def not_staged(failed: OSError, size: int) -> OSError:
    """The staging file could not hold ``size`` bytes: nothing was loaded."""
    where = tempfile.gettempdir()
    return OSError(
        failed.errno,
        f"a DCP load stages this rank's tensors on its node's disk before it writes "
        f"the state dict, and {where!r} could not take {size} bytes "
        f"({failed.strerror or failed}); nothing was loaded: set TMPDIR to a directory "
        "with room for this rank's share",
        where,
    )


class StagedTensors:
    """Decoded tensors written one after another to a file, to be copied into their
    destinations once all are there (``NodeStorageReader.read_data``). A tensor up
    to ``OVERLAP_BYTES`` is written on a thread of its own while the next one is
    read and decoded (so memory holds at most one more such tensor); a larger one
    is written before the next is read."""

    OVERLAP_BYTES = 64 * 2**20

    def __init__(self, file: IO[bytes]) -> None:
        self.fd = file.fileno()
        self.size = 0
        self.tensors: list[tuple[ReadItem, torch.Tensor, int, torch.dtype, torch.Size]] = []
        self._writer = pool("air-transfer-dcp-stage", 1)
        self._writing: Future[None] | None = None

    def add(self, item: ReadItem, tensor: torch.Tensor, target: torch.Tensor) -> None:
        """Stage ``tensor``, the value of ``item`` for ``target``, in its own dtype
        (copying it into ``target`` converts it, as torch's reader does)."""
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        self._written()
        offset, self.size = self.size, self.size + flat.numel()
        self.tensors.append((item, target, offset, tensor.dtype, tensor.size()))
        if flat.numel() <= self.OVERLAP_BYTES:
            self._writing = self._writer.submit(self._write, flat, offset)
        else:
            self._write(flat, offset)

    def _write(self, flat: torch.Tensor, offset: int) -> None:
        view = memoryview(flat.numpy())
        done = 0
        try:
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], offset + done)
        except OSError as e:
            raise not_staged(e, offset + len(view)) from None

    def finish(self) -> None:
        """Wait until every tensor is staged; raise what staging the last one raised
        (before anything of the load reaches the state dict)."""
        self._written()

    def _written(self) -> None:
        """Wait for the tensor being written; raise what writing it raised."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def copy_out(self, planner: LoadPlanner) -> None:
        """Copy every staged tensor into its destination and commit it."""
        self._written()
        mapped = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_COPY) if self.size else None
        try:
            for item, target, offset, dtype, shape in self.tensors:
                count = shape.numel()
                if count:
                    assert mapped is not None
                    source = torch.frombuffer(mapped, dtype=dtype, count=count, offset=offset)
                    target.copy_(source.view(shape))
                    del source
                planner.commit_tensor(item, target)
        finally:
            if mapped is not None:
                mapped.close()

    def close(self) -> None:
        """Let the writer thread go (after the write in flight, if any)."""
        self._writer.shutdown(wait=True)


class ViewReader(SeekableReader):
    """A seekable read-only stream over a buffer, without copying it first (as
    ``io.BytesIO`` of a memoryview would): ``torch.load`` reads each record once,
    straight into the tensor it decodes."""

    def __init__(self, view: memoryview) -> None:
        super().__init__()
        self._view = view.cast("B") if view.format != "B" or view.ndim != 1 else view
        self._pos = 0

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer: Buffer) -> int:
        out = memoryview(buffer).cast("B")
        n = max(0, min(len(out), len(self._view) - self._pos))
        out[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n
