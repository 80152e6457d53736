"""``air-transfer cp SRC DST``: one checkpoint, or a whole run, copied between node
storage and any other filesystem (either way, or node storage to node storage), and
verified: every file is read back from DST and its chunk checksums compared with
those of the bytes read from SRC.

DST is the path the copy gets (as ``cp -r SRC DST`` when DST does not exist). One
that exists is refused unless ``overwrite``, which replaces the files the copy brings
and touches nothing else there. Files go four at a time; those that make a
checkpoint whole or name checkpoints (torch DCP's ``.metadata``, Ray Train's run
state: ``StorageConfig.durable_last``) go last, so an interrupted copy is never
taken for a complete checkpoint. Each file appears whole: node storage and object
stores publish an upload only when it is closed (one that fails is dropped, and
deleted from an object store), other filesystems get it under a hidden temporary
name moved into place. An interrupted copy leaves the files it finished; run it
again with ``--overwrite``.
"""

from __future__ import annotations

import fnmatch
import posixpath
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow.fs as pafs

from air_transfer.cli.trees import CHUNK_BYTES, FileSums, Tree, join, read_sums, tree_at
from air_transfer.config import DURABLE_LAST
from air_transfer.core.threads import pool
from air_transfer.storage.durable.objects import open_whole

#: Files copied at once (an object store's throughput grows with parallel uploads).
THREADS = 4

Progress = Callable[[int], None]


@dataclass(frozen=True)
class Copied:
    """What a copy did: the files and bytes it copied and verified."""

    source: str
    destination: str
    files: int
    nbytes: int

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = asdict(self)
        d["bytes"] = d.pop("nbytes")
        return {**d, "verified": True}


def plan(
    src_fs: pafs.FileSystem,
    src: str,
    dst_fs: pafs.FileSystem,
    dst: str,
    overwrite: bool,
    shown: str | None = None,
) -> Tree:
    """What ``src`` holds, once DST is checked: refused if it exists (unless
    ``overwrite``) or is a file where a directory goes, or the other way round.
    ``shown``: DST as the user wrote it, for the errors (default ``dst``)."""
    tree = tree_at(src_fs, src)
    name = shown or dst
    [there] = dst_fs.get_file_info([dst])
    if there.type == pafs.FileType.NotFound:
        return tree
    if not overwrite:
        raise FileExistsError(
            f"{name} exists; pass --overwrite to replace the files the copy brings "
            "(nothing else there is touched)"
        )
    is_file = tree.files.keys() == {""}
    if is_file and there.type == pafs.FileType.Directory:
        raise IsADirectoryError(f"{name} is a directory; name the file the copy becomes")
    if not is_file and there.type == pafs.FileType.File:
        raise NotADirectoryError(f"{name} is a file; a directory is copied to a directory")
    return tree


def copy_between(
    src_fs: pafs.FileSystem,
    src: str,
    dst_fs: pafs.FileSystem,
    dst: str,
    tree: Tree,
    progress: Progress | None = None,
) -> dict[str, FileSums]:
    """Copy ``tree`` (at ``src``) to ``dst`` (see the module); the sums of what was
    read from each file. ``progress`` counts bytes as they go (from several threads)."""
    one_file = tree.files.keys() == {""}
    for rel in ("", *tree.dirs) if not one_file else ():
        dst_fs.create_dir(join(dst, rel), recursive=True)
    if one_file and posixpath.dirname(dst) not in ("", "/"):
        dst_fs.create_dir(posixpath.dirname(dst), recursive=True)
    last = [rel for rel in tree.files if _is_last(rel)]
    first = [rel for rel in tree.files if rel not in last]
    sums: dict[str, FileSums] = {}

    def one(rel: str) -> None:
        sums[rel] = copy_file(src_fs, join(src, rel), dst_fs, join(dst, rel), progress)

    _each(first, one)
    _each(last, one)
    return sums


def check_copy(
    dst_fs: pafs.FileSystem,
    dst: str,
    sums: dict[str, FileSums],
    src: str,
    progress: Progress | None = None,
) -> Copied:
    """Read every file of the copy at ``dst`` back and compare it with what was read
    from ``src`` (``sums``); OSError naming the files that differ."""
    differ = []

    def check(rel: str) -> None:
        if read_sums(dst_fs, join(dst, rel), CHUNK_BYTES, progress) != sums[rel]:
            differ.append(join(dst, rel))

    _each(list(sums), check)
    if differ:
        raise OSError(
            f"{len(differ)} file(s) read back from {dst} differ from what was read from "
            f"{src}: {', '.join(sorted(differ)[:10])}"
        )
    return Copied(src, dst, len(sums), sum(s.size for s in sums.values()))


def copy_file(
    src_fs: pafs.FileSystem, src: str, dst_fs: pafs.FileSystem, dst: str, progress: Progress | None
) -> FileSums:
    """Copy one file so that it appears at ``dst`` whole or not at all (the library's
    one whole-file writer, ``storage.durable.objects.open_whole``); the sums of the
    bytes read from ``src``."""
    writer = open_whole(dst_fs, dst)
    try:
        sums = read_sums(src_fs, src, CHUNK_BYTES, progress, writer.write)
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    return sums


def _each(items: list[str], work: Callable[[str], None]) -> None:
    """``work`` on every item, ``THREADS`` at a time; the first error raised."""
    if not items:
        return
    with pool("air-transfer-cp", THREADS) as copies:
        for future in [copies.submit(work, item) for item in items]:
            future.result()


def _is_last(rel: str) -> bool:
    name = posixpath.basename(rel)
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in DURABLE_LAST)


class Counter:
    """A thread-safe byte counter feeding a progress bar."""

    def __init__(self, advance: Progress) -> None:
        self._lock = threading.Lock()
        self._advance = advance

    def __call__(self, nbytes: int) -> None:
        with self._lock:
            self._advance(nbytes)
