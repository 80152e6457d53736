"""The durable tier as a read-only pyarrow filesystem: what its manifests name, each
file decoded (its codec) and every chunk checked, for a reader outside the cluster
(``air-transfer cp`` out of a bucket, a script restoring a checkpoint by hand).

``find_tier`` says whether a path of a filesystem lies in a durable tier: a base
above it (or the path itself) whose root manifest is there. Paths of the view are
the tier's own paths (``bucket/prefix/...``); writes are refused.
"""

from __future__ import annotations

import errno
import os
import posixpath
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from air_transfer.core.reader import buffered
from air_transfer.storage.durable.reads import TierReads, open_verified
from air_transfer.storage.durable.records import manifest_path
from air_transfer.storage.durable.target import DurableTarget


def find_tier(fs: pafs.FileSystem, path: str) -> DurableTarget | None:
    """The durable tier ``path`` of ``fs`` lies in (its base at or above ``path``),
    or None: a directory is a tier's base when its root manifest is there."""
    at = path.rstrip("/")
    while at and at not in (".", "/"):
        target = DurableTarget(fs, at, f"{fs.type_name}:{at}")
        [info] = fs.get_file_info([manifest_path(target, "")])
        if info.type == pafs.FileType.File:
            return target
        parent = posixpath.dirname(at)
        if parent == at:
            break
        at = parent
    return None


class TierView(pafs.FileSystemHandler):
    """Durable tier ``target`` as its manifests name it, read only."""

    def __init__(self, target: DurableTarget, chunk_bytes: int = 32 * 1024 * 1024) -> None:
        self.target = target
        self.reads = TierReads(target)
        self.chunk_bytes = chunk_bytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TierView) and other.target.base == self.target.base

    def __ne__(self, other: object) -> bool:
        return not self == other

    def get_type_name(self) -> str:
        return "air-transfer-durable"

    def normalize_path(self, path: str) -> str:
        return path

    def _rel(self, path: str) -> str:
        return self.target.rel(path.rstrip("/"))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        out = []
        for path in paths:
            kind, size, mtime = self.reads.info(self._rel(path), set())
            out.append(pafs.FileInfo(path, kind, mtime_ns=mtime, size=size))
        return out

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir.rstrip("/")
        listed = self.reads.listing(self._rel(base), selector.recursive, set())
        if listed is None:
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), base)
        return [pafs.FileInfo(f"{base}/{r}", t, mtime_ns=m, size=s) for r, t, s, m in listed]

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self.open_input_file(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        rel = self._rel(path)
        record = self.reads.record(rel)
        if record is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path)
        reader = open_verified(self.target, rel, record)
        return pa.PythonFile(buffered(reader, record.chunk_bytes), mode="r")

    def _read_only(self, *_: Any, **__: Any) -> Any:
        raise PermissionError(errno.EROFS, "the durable tier is read here, never written")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = _read_only
    delete_file = move = copy_file = open_output_stream = open_append_stream = _read_only
