"""What a scan found, as plain data: the ``Stamp`` of a file's version, and ``Scan``,
the entries and stamps of a checkpoint directory (made on first use from what the
walk in ``core.scan`` kept)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import pyarrow.fs as pafs

from air_transfer.core.entry import Entry


class Stamp(NamedTuple):
    """What can be cheaply observed of a file's version: if none of it changed, its
    bytes did not either (``packing`` says when that inference holds).

    Local files fill every field from ``stat``; other pyarrow filesystems only know
    ``size`` and ``mtime_ns`` (None where unknown). ``nlink`` drops when the file is
    replaced by a rename or removed while open, with no timestamp needed.
    A NamedTuple: millions travel with a streamed payload, compactly.
    """

    size: int
    mtime_ns: int | None
    ctime_ns: int | None = None
    ino: int | None = None
    dev: int | None = None
    nlink: int | None = None

    @classmethod
    def of_stat(cls, st: os.stat_result) -> Stamp:
        return cls(st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev, st.st_nlink)

    @classmethod
    def of_info(cls, info: pafs.FileInfo) -> Stamp:
        return cls(info.size, info.mtime_ns)


#: What the local walk keeps of a regular file: its path and its ``stat``, made into an
#: ``Entry`` and a ``Stamp`` on first use (``Scan``).
FileRow = tuple[str, os.stat_result]


class Scan:
    """What ``scan`` found: every entry (``entries``, manifest order), and the regular
    files in stream order (``files``) with the stamp each had when scanned
    (``stamps[i]`` is ``files[i]``).

    Made from the walk's rows on first use, once, on whichever thread asks first:
    ``to_object_ref_async`` returns after the walk and leaves this to a background
    thread (a 20,000-file tree's entries cost as much as its stats).
    """

    def __init__(
        self, rows: Sequence[Entry | FileRow], stamps: Mapping[str, Stamp] | None = None
    ) -> None:
        """``rows``: entries in manifest order, a local file as a ``FileRow``; a file
        given as an ``Entry`` has its stamp in ``stamps``."""
        self._rows = rows
        self._stamps = stamps or {}
        self._lock = threading.Lock()
        self._made: tuple[tuple[Entry, ...], tuple[Entry, ...], tuple[Stamp, ...]] | None = None

    @property
    def entries(self) -> tuple[Entry, ...]:
        return self._make()[0]

    @property
    def files(self) -> tuple[Entry, ...]:
        return self._make()[1]

    @property
    def stamps(self) -> tuple[Stamp, ...]:
        return self._make()[2]

    @property
    def total_bytes(self) -> int:
        """Bytes in all files together (without making the entries)."""
        return sum(r[1].st_size if isinstance(r, tuple) else r.size for r in self._rows)

    def _make(self) -> tuple[tuple[Entry, ...], tuple[Entry, ...], tuple[Stamp, ...]]:
        with self._lock:
            if self._made is None:
                self._made = _entries(self._rows, self._stamps)
            return self._made


def _entries(
    rows: Sequence[Entry | FileRow], given: Mapping[str, Stamp]
) -> tuple[tuple[Entry, ...], tuple[Entry, ...], tuple[Stamp, ...]]:
    entries: list[Entry] = []
    files: list[Entry] = []
    stamps: list[Stamp] = []
    for row in rows:
        if isinstance(row, tuple):
            rel, st = row
            entry = Entry(rel, "file", st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
            files.append(entry)
            stamps.append(Stamp.of_stat(st))
        else:
            entry = row
            if entry.kind == "file":
                files.append(entry)
                stamps.append(given[entry.path])
        entries.append(entry)
    return tuple(entries), tuple(files), tuple(stamps)
