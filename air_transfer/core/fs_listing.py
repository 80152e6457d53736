"""The one recursive listing of a pyarrow filesystem: every entry under a directory,
each with its path relative to that directory. Any filesystem (local, S3, fsspec's)
names what it lists its own way (with or without a leading ``/``); callers see one.
"""

from __future__ import annotations

import pyarrow.fs as pafs

#: One entry of a listing: its path relative to the listed directory, and its info.
Listed = tuple[str, pafs.FileInfo]


def list_below(fs: pafs.FileSystem, top: str, missing_ok: bool = False) -> list[Listed]:
    """Every entry under the directory ``top`` of ``fs``, at any depth, in the order
    ``fs`` lists them. FileNotFoundError if nothing is at ``top`` (unless
    ``missing_ok``: none), NotADirectoryError if a file is, as pyarrow raises them."""
    selector = pafs.FileSelector(top, recursive=True, allow_not_found=missing_ok)
    base = top.rstrip("/")
    return [(relative(base, info.path), info) for info in fs.get_file_info(selector)]


def relative(base: str, path: str) -> str:
    """``path``, listed under ``base`` (no trailing ``/``), relative to it."""
    if not base:
        return path.lstrip("/")
    return path[len(base) + 1 :] if path.startswith(base + "/") else path
