"""Chunks -> files under a staging directory, verified, then published atomically.

The target only ever shows complete, verified files: everything is written into a
hidden sibling (``.<name>.air-staging-<pid>-<random>``) and renamed into place at the
end. An existing target is merged into (what ``ray.train.Checkpoint.to_directory``
does) one whole file at a time with ``os.replace``, after a check that no path changes
kind (file vs directory), so a failure leaves it as it was. Paths come only from a
validated Manifest, never from the chunk bytes: no tar, nothing that follows ``..`` or
a symlink out of the target (Ray Tune's tar unpacking does: ray-project/ray#65670).

Plain Python: unit-tested without Ray.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, BinaryIO

from air_transfer.direct_io import DirectFileWriter, should_write_direct
from air_transfer.errors import ChecksumError
from air_transfer.layout import Span, iter_chunk_spans
from air_transfer.manifest import Entry, Manifest, chunk_checksum

_STAGING_MARK = ".air-staging-"


def write_tree(
    manifest: Manifest,
    chunks: Iterable[Any],
    target: str | os.PathLike[str],
    verify: bool = True,
    direct_io: bool = True,
) -> str:
    """Rebuild the checkpoint described by ``manifest`` at ``target`` from its chunks
    (buffers, in order) and return the target path. With ``direct_io``, large files
    bypass the page cache (see ``air_transfer.direct_io``).

    Raises ChecksumError (target untouched) if a chunk does not match its checksum or
    the chunks do not add up to the manifest; NotADirectoryError if ``target`` is a
    file; FileExistsError if merging would turn a file into a directory or back.
    """
    target = os.path.abspath(os.fspath(target))
    if os.path.lexists(target) and not os.path.isdir(target):
        raise NotADirectoryError(f"checkpoint target {target!r} exists and is not a directory")
    if os.path.isdir(target):
        _check_merge(manifest, target)
    parent, name = os.path.split(target)
    os.makedirs(parent, exist_ok=True)
    _remove_stale_staging(parent, name)

    staging = os.path.join(parent, f".{name}{_STAGING_MARK}{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(staging, 0o777)  # the umask applies, as for a directory made by makedirs
    try:
        _write_entries(manifest, chunks, staging, verify, direct_io)
        with _target_lock(target):
            _publish(manifest, staging, target)
    finally:
        if os.path.lexists(staging):
            shutil.rmtree(staging, ignore_errors=True)
    return target


def _write_entries(
    manifest: Manifest, chunks: Iterable[Any], root: str, verify: bool, direct_io: bool
) -> None:
    for e in manifest.entries:
        if e.kind == "dir":
            os.mkdir(_join(root, e.path), 0o700)
    files = list(manifest.files())
    with _FileSink(root, files, direct_io) as sink:
        spans = iter_chunk_spans([f.size for f in files], manifest.chunk_bytes)
        count = 0
        for index, chunk in enumerate(chunks):
            if index >= manifest.num_chunks:
                raise ChecksumError(
                    f"payload has more chunks than the {manifest.num_chunks} its manifest lists"
                )
            chunk_spans = next(spans)
            view = memoryview(chunk).cast("B")
            check_chunk(manifest, index, view, verify, files, chunk_spans)
            for span in chunk_spans:
                end = span.chunk_offset + span.length
                sink.write(span.file_index, view[span.chunk_offset : end])
            count += 1
        if count != manifest.num_chunks:
            raise ChecksumError(
                f"payload ended after {count} of {manifest.num_chunks} chunks; nothing "
                "was published"
            )
    for e in manifest.entries:
        path = _join(root, e.path)
        if e.kind == "symlink":
            os.symlink(e.target or "", path)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)
        elif e.kind == "file":
            os.chmod(path, e.mode)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns))


class _FileSink:
    """Writes the stream's bytes into files in order; one file open at a time, large
    ones around the page cache if ``direct_io``."""

    def __init__(self, root: str, files: Sequence[Entry], direct_io: bool) -> None:
        self.root, self.files, self.direct_io = root, files, direct_io
        self.index = -1
        self.handle: BinaryIO | DirectFileWriter | None = None

    def _advance_to(self, file_index: int) -> None:
        while self.index < file_index:
            self._close()
            self.index += 1
            entry = self.files[self.index]
            path = _join(self.root, entry.path)
            if should_write_direct(entry.size, self.direct_io):
                self.handle = DirectFileWriter(path)
            else:
                self.handle = open(path, "wb", buffering=0)

    def _close(self, failed: bool = False) -> None:
        handle, self.handle = self.handle, None
        if isinstance(handle, DirectFileWriter) and failed:
            handle.abort()
        elif handle is not None:
            handle.close()

    def write(self, file_index: int, view: memoryview) -> None:
        self._advance_to(file_index)
        if isinstance(self.handle, DirectFileWriter):
            self.handle.write(view)
            return
        assert self.handle is not None
        while view:
            written = self.handle.write(view)
            view = view[written:]

    def __enter__(self) -> _FileSink:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self._advance_to(len(self.files) - 1)  # trailing empty files
        self._close(failed=exc_type is not None)


def _publish(manifest: Manifest, staging: str, target: str) -> None:
    if not os.path.lexists(target):
        _finish_dirs(manifest, staging)
        try:
            os.rename(staging, target)
            return
        except OSError as e:  # another writer published first: merge over it
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    _check_merge(manifest, target)
    for e in manifest.entries:
        dest = _join(target, e.path)
        if e.kind == "dir":
            os.makedirs(dest, exist_ok=True)
        else:
            os.replace(_join(staging, e.path), dest)
    _finish_dirs(manifest, target)


def check_chunk(
    manifest: Manifest,
    index: int,
    view: memoryview,
    verify: bool = True,
    files: Sequence[Entry] | None = None,
    spans: Sequence[Span] | None = None,
) -> None:
    """Raise ChecksumError, naming the chunk and the files it carries, unless chunk
    ``index`` has the manifest's length and (if ``verify``) checksum."""
    expected = manifest.chunk_length(index)
    if len(view) == expected and (not verify or chunk_checksum(view) == manifest.chunks[index]):
        return
    if files is None or spans is None:
        files = list(manifest.files())
        sizes = [f.size for f in files]
        spans = next(iter_chunk_spans(sizes, manifest.chunk_bytes, index))
    raise ChecksumError(
        f"chunk {index} of {manifest.num_chunks} ({len(view)} bytes, expected {expected}) "
        f"does not match its manifest checksum; it carries {_describe(files, spans)}. "
        "The payload is corrupt or was altered; nothing was published"
    )


def _finish_dirs(manifest: Manifest, root: str) -> None:
    """Directory modes and mtimes last, deepest first: writing inside a directory
    changes its mtime, and a read-only mode would stop the writes."""
    for e in reversed(manifest.entries):
        if e.kind == "dir":
            path = _join(root, e.path)
            os.chmod(path, e.mode)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns))


def _check_merge(manifest: Manifest, target: str) -> None:
    """Refuse, before anything is written, a merge that would change a path's kind."""
    for e in manifest.entries:
        try:
            st = os.lstat(_join(target, e.path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        is_dir = stat.S_ISDIR(st.st_mode)
        if (e.kind == "dir") != is_dir:
            there = "a directory" if is_dir else "a file or symlink"
            raise FileExistsError(
                f"cannot merge checkpoint into {target!r}: {e.path!r} is {there} there "
                f"but a {e.kind} in the checkpoint; remove it or choose another target"
            )


@contextlib.contextmanager
def _target_lock(target: str) -> Iterator[None]:
    """Serialise publishing into one target across processes on this node, so two
    consumers writing the same directory each publish whole."""
    lock_dir = os.path.join(tempfile.gettempdir(), "air-transfer-locks")
    os.makedirs(lock_dir, exist_ok=True)
    digest = hashlib.sha256(os.path.realpath(target).encode()).hexdigest()[:32]
    with open(os.path.join(lock_dir, f"{digest}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _remove_stale_staging(parent: str, name: str) -> None:
    """Remove staging directories left by writers of this target that died mid-write
    (their pid no longer runs on this node)."""
    prefix = f".{name}{_STAGING_MARK}"
    with contextlib.suppress(FileNotFoundError), os.scandir(parent) as it:
        for d in it:
            if not d.name.startswith(prefix):
                continue
            pid_text = d.name[len(prefix) :].split("-", 1)[0]
            if pid_text.isdigit() and not _pid_alive(int(pid_text)):
                shutil.rmtree(d.path, ignore_errors=True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _join(root: str, relpath: str) -> str:
    return os.path.join(root, *relpath.split("/"))


def _describe(files: Sequence[Entry], spans: Sequence[Any], limit: int = 5) -> str:
    names = [files[s.file_index].path for s in spans]
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" and {len(names) - limit} more files" if len(names) > limit else ""
    return f"{shown}{more}" if names else "no file bytes"
