"""Chunks -> files under a staging directory, verified, then published atomically.

Everything is written into a hidden sibling of the target (``air_transfer.core.staging``),
and only a complete, verified tree is published: a fresh target with one ``rename``;
an existing one (merged into, as ``ray.train.Checkpoint.to_directory`` does) by
building the merged tree in the staging (``air_transfer.core.merge``) and swapping it in
with ``renameat2(RENAME_EXCHANGE)``. The target is absent or complete, whatever
happens to the writer; a writer that dies mid-swap on a filesystem without the
exchange is finished or rolled back by the next one.

Paths come only from a validated Manifest, never from the chunk bytes: no tar, nothing
that follows ``..`` or a symlink out of the target (Ray Tune's tar unpacking does:
ray-project/ray#65670), checked against the target as it is on disk too.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, TypeVar

from air_transfer.core.checksum import chunk_checksum, chunk_hasher
from air_transfer.core.entry import Entry
from air_transfer.core.file_sink import FileSink
from air_transfer.core.manifest import Manifest
from air_transfer.core.names import under
from air_transfer.core.plan import Span, iter_chunk_spans
from air_transfer.core.publish import check_before_writing, not_a_directory, publish
from air_transfer.core.staging import Site
from air_transfer.errors import ChecksumError

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

T = TypeVar("T")


def write_tree(
    manifest: Manifest,
    chunks: Iterable[Buffer],
    target: str | os.PathLike[str],
    verify: bool = True,
    direct_io: bool = True,
    expected: Iterable[str] | None = None,
    *,
    follow_target: bool = True,
    chunks_kept: bool = False,
) -> str:
    """Rebuild the checkpoint described by ``manifest`` at ``target`` from its chunks
    (buffers, in order) and return the target path. With ``direct_io``, large files
    bypass the page cache (see ``air_transfer.core.direct_io``). ``expected`` gives the
    chunks' checksums in order where the manifest does not carry them yet (a
    transfer still being packed); each is asked for only when its chunk arrives.
    A symlink at ``target`` itself is written through to its directory, unless
    ``follow_target`` is False (a caller that resolved the target itself, confined:
    node storage): such a link is then NotADirectoryError. ``chunks_kept``: each
    chunk stays unchanged while referenced (an object-store chunk), so a large file's
    bytes may still be written from it while the next one is checked; a source that
    refills its buffers (a read-ahead ring) leaves it False.

    Raises ChecksumError (target untouched) if a chunk does not match its checksum or
    the chunks do not add up to the manifest; NotADirectoryError if ``target`` is a
    file; FileExistsError if merging would turn a file into a directory or back;
    ManifestError if merging would leave a symlink leading out of the target.
    """
    target = os.path.abspath(os.fspath(target))
    real = target
    if follow_target and os.path.islink(target):  # a link to a directory: write into it
        if not os.path.isdir(target):
            raise not_a_directory(target)
        real = os.path.realpath(target)
    parent, name = os.path.split(real)
    _makedirs(parent)
    site = Site(parent, name)
    site.clean_up()
    check_before_writing(manifest, site, real)
    with site.staging() as staging:
        _write_entries(
            manifest, chunks, staging.path, verify, direct_io, real, expected, chunks_kept
        )
        with site.publish_lock():
            site.recover_locked()  # a writer may have died mid-swap meanwhile
            publish(manifest, staging, real)
    return target


def checked_chunks(chunks: Iterable[T], check: Callable[[], None] | None) -> Iterable[T]:
    """``chunks``, calling ``check()`` before each: a writer that must give up when
    told to (a report of a stopped Ray Train worker group) raises from it, and so
    publishes nothing."""
    return chunks if check is None else _checked(chunks, check)


def _checked(chunks: Iterable[T], check: Callable[[], None]) -> Iterator[T]:
    for chunk in chunks:
        check()
        yield chunk


def _write_entries(
    manifest: Manifest,
    chunks: Iterable[Buffer],
    root: str,
    verify: bool,
    direct_io: bool,
    target: str,
    expected: Iterable[str] | None = None,
    chunks_kept: bool = False,
) -> None:
    checksums = iter(expected) if expected is not None else None
    for e in manifest.entries:
        if e.kind == "dir":
            os.mkdir(under(root, e.path), 0o700)
    files = list(manifest.files())
    with FileSink(root, files, direct_io, chunks_kept) as sink:
        spans = iter_chunk_spans([f.size for f in files], manifest.chunk_bytes)
        count = 0
        for index, chunk in enumerate(chunks):
            if index >= manifest.num_chunks:
                raise ChecksumError(
                    errno.EBADMSG,
                    f"payload has more chunks than the {manifest.num_chunks} its manifest "
                    "lists; nothing was published",
                    target,
                )
            chunk_spans = next(spans)
            view = memoryview(chunk).cast("B")
            checksum = next(checksums) if checksums is not None else None
            # The length first; the checksum of the bytes as they are written (one
            # pass): nothing is published before the whole chunk matched.
            check_chunk(manifest, index, view, False, files, chunk_spans, target)
            hasher = chunk_hasher() if verify else None
            for span in chunk_spans:
                end = span.chunk_offset + span.length
                sink.write(span.file_index, view[span.chunk_offset : end], hasher)
            if hasher is not None and hasher.hexdigest() != _checksum(manifest, index, checksum):
                raise chunk_mismatch(manifest, index, view, files, chunk_spans, target)
            count += 1
        if count != manifest.num_chunks:
            raise ChecksumError(
                errno.EBADMSG,
                f"payload ended after {count} of {manifest.num_chunks} chunks; nothing "
                "was published",
                target,
            )
    for e in manifest.entries:
        path = under(root, e.path)
        if e.kind == "symlink":
            os.symlink(e.target or "", path)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns), follow_symlinks=False)
        elif e.kind == "file":
            os.chmod(path, e.mode)
            os.utime(path, ns=(e.mtime_ns, e.mtime_ns))


def _checksum(manifest: Manifest, index: int, expected: str | None) -> str:
    if expected is not None:
        return expected
    if manifest.chunks is None:
        raise ValueError(
            f"chunk {index} cannot be verified: the manifest's checksums are still being "
            "computed and none was given"
        )
    return manifest.chunks[index]


def check_chunk(
    manifest: Manifest,
    index: int,
    view: memoryview,
    verify: bool = True,
    files: Sequence[Entry] | None = None,
    spans: Sequence[Span] | None = None,
    target: str | None = None,
    expected: str | None = None,
) -> None:
    """Raise ChecksumError (errno EBADMSG, as for a bad filesystem checksum; naming
    ``target`` if given), naming the chunk and the files it carries, unless chunk
    ``index`` has the manifest's length and (if ``verify``) checksum: ``expected``,
    or the manifest's when None."""
    length = manifest.chunk_length(index)
    if len(view) == length and (
        not verify or chunk_checksum(view) == _checksum(manifest, index, expected)
    ):
        return
    raise chunk_mismatch(manifest, index, view, files, spans, target)


def chunk_mismatch(
    manifest: Manifest,
    index: int,
    view: memoryview,
    files: Sequence[Entry] | None = None,
    spans: Sequence[Span] | None = None,
    target: str | None = None,
) -> ChecksumError:
    """The ChecksumError of chunk ``index`` (``check_chunk``)."""
    length = manifest.chunk_length(index)
    if files is None or spans is None:
        files = list(manifest.files())
        sizes = [f.size for f in files]
        spans = next(iter_chunk_spans(sizes, manifest.chunk_bytes, index))
    message = (
        f"chunk {index} of {manifest.num_chunks} ({len(view)} bytes, expected {length}) "
        f"does not match its manifest checksum; it carries {_describe(files, spans)}. "
        "The payload is corrupt or was altered; nothing was published"
    )
    if target is None:
        return ChecksumError(errno.EBADMSG, message)
    return ChecksumError(errno.EBADMSG, message, target)


def _makedirs(path: str) -> None:
    """``os.makedirs(path, exist_ok=True)`` without its recursion per missing level."""
    missing = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for p in reversed(missing):
        try:
            os.mkdir(p)
        except FileExistsError:
            if not os.path.isdir(p):
                raise


def _describe(files: Sequence[Entry], spans: Sequence[Span], limit: int = 5) -> str:
    names = [files[s.file_index].path for s in spans]
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" and {len(names) - limit} more files" if len(names) > limit else ""
    return f"{shown}{more}" if names else "no file bytes"
