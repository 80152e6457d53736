"""Whole files on any pyarrow filesystem, and the durable tier's objects: the one way
the library writes a file there so that it appears whole or not at all, used by the
drain, the manifests and ``air-transfer cp``.

``open_whole`` picks how by where: S3 through boto3 (``s3``: parts sized to the file,
aborted on failure); node storage and object stores in place (node storage publishes
an upload when it is closed and drops one that is not; pyarrow's own S3 or GCS
stream, which cannot abort, is completed and deleted); any other filesystem under a
hidden temporary name (``.<name>.air-durable-<id>``) moved into place once whole.

``TierObjects`` is one durable tier's store: writers, ``head`` (what the object is
now: its size and the tier's version tag of it), server-side copies where the tier
has them, ranged reads, deletes, and the multipart uploads a dead drain left.
"""

from __future__ import annotations

import contextlib
import posixpath
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow.fs as pafs

from air_transfer.storage.durable import s3
from air_transfer.storage.durable.target import DurableTarget, staged_name

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

#: Filesystems whose writes appear only once complete (an object store's upload).
ATOMIC_WRITES = ("s3", "gcs")
#: pyarrow's type name of node storage's filesystem (``NodeStorageHandler``).
NODE_STORAGE = "py::air-transfer-node"


class Whole(Protocol):
    """A file being written whole: ``commit`` makes it appear and returns the tier's
    version tag of it; ``abort`` leaves nothing (what was there before stays)."""

    def write(self, data: Buffer) -> None: ...

    def commit(self) -> str: ...

    def abort(self) -> None: ...


@dataclass(frozen=True)
class Head:
    """An object as the tier answers for it now: its size, its version tag (changes
    when anything replaces it) and the content digest it was uploaded with (S3
    through boto3 only; None elsewhere)."""

    size: int
    tag: str
    digest: str | None = None


def stamp(info: pafs.FileInfo) -> str:
    """The version tag of a file on a filesystem without ETags: its size and mtime."""
    return f"{info.size}:{info.mtime_ns}"


class _InPlace:
    """Written at its own path: node storage and object stores publish it at close."""

    def __init__(self, fs: pafs.FileSystem, path: str) -> None:
        self.fs, self.path = fs, path
        # The only reference to the stream: dropped unclosed, node storage aborts the
        # upload (a closed one would be published), so no traceback may hold it.
        self._stream = [fs.open_output_stream(path)]

    def write(self, data: Buffer) -> None:
        self._stream[0].write(data)

    def commit(self) -> str:
        self._stream.pop().close()
        [info] = self.fs.get_file_info([self.path])
        return stamp(info)

    def abort(self) -> None:
        if not self._stream:
            return
        if str(self.fs.type_name) == NODE_STORAGE:
            self._stream.clear()  # dropped unclosed: discarded
            return
        # pyarrow's S3 and GCS streams complete whatever they hold when closed.
        with contextlib.suppress(OSError):
            self._stream.pop().close()
        with contextlib.suppress(OSError):
            self.fs.delete_file(self.path)


class _Staged:
    """Written under a hidden temporary name beside ``path``, moved there once whole."""

    def __init__(self, fs: pafs.FileSystem, path: str) -> None:
        self.fs, self.path = fs, path
        parent = posixpath.dirname(path)
        if parent:
            fs.create_dir(parent, recursive=True)
        self.staged = posixpath.join(parent, staged_name(posixpath.basename(path)))
        self._stream: Any = fs.open_output_stream(self.staged)

    def write(self, data: Buffer) -> None:
        self._stream.write(data)

    def commit(self) -> str:
        try:
            self._stream.close()
            self.fs.move(self.staged, self.path)
        except BaseException:
            self.abort()
            raise
        self._stream = None
        [info] = self.fs.get_file_info([self.path])
        return stamp(info)

    def abort(self) -> None:
        if self._stream is None:
            return
        with contextlib.suppress(OSError):
            self._stream.close()
        self._stream = None
        with contextlib.suppress(OSError):
            self.fs.delete_file(self.staged)


def open_whole(
    fs: pafs.FileSystem,
    path: str,
    *,
    size: int | None = None,
    digest: str | None = None,
    part: int = 32 * s3.MiB,
    max_parts: int = s3.MAX_PARTS,
    budget: s3.PartBudget | None = None,
) -> Whole:
    """A writer of ``path`` on ``fs`` that makes it appear whole or not at all (see
    the module). On S3: parts of at least ``part`` bytes, enough for ``size`` in
    ``max_parts``, ``digest`` kept with the object."""
    kind = str(fs.type_name)
    client = s3.client_for(fs) if kind == "s3" else None
    if client is not None:
        chosen = s3.part_bytes(size, part, max_parts)
        return s3.S3Whole(client, path, chosen, budget or _default_budget(), digest)
    if kind in ATOMIC_WRITES or kind == NODE_STORAGE:
        return _InPlace(fs, path)
    return _Staged(fs, path)


def write_whole(fs: pafs.FileSystem, path: str, data: Buffer) -> str:
    """``data`` at ``path``, whole or not at all; its version tag."""
    return _filled(open_whole(fs, path, size=len(memoryview(data))), data)


def _filled(writer: Whole, data: Buffer) -> str:
    """``writer`` given ``data`` and committed (aborted if writing fails); its tag."""
    try:
        writer.write(data)
    except BaseException:
        writer.abort()
        raise
    return writer.commit()


_budget: s3.PartBudget | None = None


def _default_budget() -> s3.PartBudget:
    global _budget
    if _budget is None:
        _budget = s3.PartBudget(256 * s3.MiB, 8)
    return _budget


class TierObjects:
    """The objects of durable tier ``target``: ``part`` and ``max_parts`` size S3
    uploads; ``budget`` bounds the bytes of parts in flight over all of them."""

    def __init__(
        self,
        target: DurableTarget,
        part: int = 32 * s3.MiB,
        max_parts: int = s3.MAX_PARTS,
        budget: s3.PartBudget | None = None,
    ) -> None:
        self.target = target
        self.fs = target.filesystem
        self.client = s3.client_for(self.fs)
        self.part, self.max_parts = part, max_parts
        self.budget = budget or _default_budget()

    @property
    def server_side_copies(self) -> bool:
        """Whether a copy inside the tier moves no byte through this process."""
        return self.client is not None

    def writer(self, path: str, size: int | None, digest: str | None) -> Whole:
        return open_whole(
            self.fs, path, size=size, digest=digest, part=self.part,
            max_parts=self.max_parts, budget=self.budget,
        )  # fmt: skip

    def put(self, path: str, data: Buffer, digest: str | None = None) -> str:
        """``data`` at ``path``, whole; its tag."""
        return _filled(self.writer(path, len(memoryview(data)), digest), data)

    def head(self, path: str) -> Head | None:
        """What is at ``path`` now (None: nothing, or not a file)."""
        if self.client is not None:
            found = s3.head(self.client, path)
            return None if found is None else Head(found.size, found.tag, found.digest)
        [info] = self.fs.get_file_info([path])
        if info.type != pafs.FileType.File:
            return None
        return Head(int(info.size), stamp(info))

    def copy(self, src: str, dst: str, size: int) -> str:
        """A server-side copy of ``src`` to ``dst`` (``server_side_copies`` only);
        the copy's tag."""
        if self.client is None:
            raise NotImplementedError(f"{self.target.uri} has no server-side copies here")
        return s3.copy(self.client, src, dst, size, s3.part_bytes(size, self.part, self.max_parts))

    def read(self, path: str, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` of the object ``path``."""
        with self.fs.open_input_file(path) as f:
            return bytes(f.read_at(length, offset))

    def get(self, path: str) -> bytes | None:
        """The whole object ``path``, one version of it (on S3 one GET: pyarrow's stream
        asks for the size, then ranges, and an object replaced between reads comes
        back cut); None if there is none."""
        if self.client is not None:
            return s3.get(self.client, path)
        try:
            with self.fs.open_input_stream(path) as f:
                return bytes(f.read())
        except FileNotFoundError:
            return None

    def delete(self, path: str) -> None:
        """Delete the object ``path`` (nothing there is fine)."""
        with contextlib.suppress(FileNotFoundError):
            self.fs.delete_file(path)

    def abort_uploads(self) -> int:
        """Abort the multipart uploads under the tier's base that nobody completes
        (a drain killed or cut off mid-upload); how many."""
        if self.client is None:
            return 0
        return s3.abort_uploads(self.client, self.target.base)
