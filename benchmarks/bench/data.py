"""Checkpoint data for the bench: random-data checkpoints in three layouts, written
once and cached in ``--data-dir`` (``--clean`` removes them), and tree digests that
verify a round trip's output byte for byte."""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import time
from typing import Any

import xxhash

from benchmarks.units import MiB

GB = 10**9
#: Blocks in which random checkpoint data is generated and streamed for hashing.
IO_BLOCK = 64 * MiB
LAYOUTS = ("big", "small", "mixed")


# -- checkpoint data ---------------------------------------------------------------------


def layout_plan(
    layout: str, size_bytes: int, small_file_bytes: int
) -> tuple[list[tuple[str, int]], list[str]]:
    """``(files, empty_dirs)`` for a checkpoint of about ``size_bytes``: files as
    ``(relative path, bytes)``. ``big`` is one model file, ``small`` is many files of
    ``small_file_bytes`` (100 per directory), ``mixed`` is half one big file, a
    quarter in 8 shards, a quarter in small files, plus an empty file and directory."""
    if layout == "big":
        return [("model.bin", size_bytes)], []
    if layout == "small":
        count = max(1, round(size_bytes / small_file_bytes))
        return [(f"d{i // 100:04d}/f{i:06d}.bin", small_file_bytes) for i in range(count)], []
    if layout != "mixed":
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    big, shard = size_bytes // 2, size_bytes // 32
    files = [("model.bin", big)] + [(f"shards/shard-{i}.bin", shard) for i in range(8)]
    rest = size_bytes - big - 8 * shard
    count = max(1, rest // small_file_bytes)
    sizes = [small_file_bytes] * (count - 1) + [rest - (count - 1) * small_file_bytes]
    files += [(f"small/s{i // 100:04d}/f{i:06d}.bin", n) for i, n in enumerate(sizes)]
    return [*files, ("meta/empty.txt", 0)], ["logs"]


def checkpoint_key(layout: str, size_bytes: int, small_file_bytes: int) -> str:
    """The cache directory name of one checkpoint: layout, size, small-file size."""
    key = f"{layout}-{size_bytes}B"
    return key if layout == "big" else f"{key}-{small_file_bytes // 1024}KiB"


_CACHE_NAME = re.compile(
    r"^\.?(big|small|mixed)-\d+B(-\d+KiB)?(\.partial-\d+)?$|^out$|^sparse-\d+B$"
)


def make_checkpoint(data_dir: str, layout: str, size_bytes: int, small_file_bytes: int) -> str:
    """The path of a random-data checkpoint, written once and cached in ``data_dir``.

    Written under a ``.partial`` name and renamed when complete, so an interrupted run
    never leaves a truncated checkpoint to be reused.
    """
    key = checkpoint_key(layout, size_bytes, small_file_bytes)
    path = os.path.join(data_dir, key)
    if os.path.isdir(path):
        return path
    partial = os.path.join(data_dir, f".{key}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    files, empty_dirs = layout_plan(layout, size_bytes, small_file_bytes)
    for relpath, nbytes in files:
        target = os.path.join(partial, relpath)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _write_random(target, nbytes)
    for relpath in empty_dirs:
        os.makedirs(os.path.join(partial, relpath), exist_ok=True)
    os.rename(partial, path)
    return path


def _write_random(path: str, nbytes: int) -> None:
    """Incompressible bytes, ``IO_BLOCK`` at a time: never the whole file in memory."""
    with open(path, "wb") as f:
        for offset in range(0, nbytes, IO_BLOCK):
            f.write(os.urandom(min(IO_BLOCK, nbytes - offset)))


def checkpoint_sizes(opts: argparse.Namespace, layout: str) -> list[tuple[float, int]]:
    """``(size_gb as asked, bytes as written)`` for every size of ``layout``."""
    small = opts.small_file_kib * 1024
    if layout == "small" and opts.small_files:
        sizes = [opts.small_files * small / GB]
    else:
        sizes = sorted(opts.sizes)
    out = []
    for size_gb in sizes:
        files, _ = layout_plan(layout, round(size_gb * GB), small)
        out.append((size_gb, sum(n for _, n in files)))
    return out


def clean_data_dir(data_dir: str) -> list[str]:
    """Delete the cached checkpoints and outputs this bench made in ``data_dir`` (and
    nothing else there); returns what was removed."""
    if not os.path.isdir(data_dir):
        return []
    removed = [n for n in os.listdir(data_dir) if _CACHE_NAME.match(n)]
    for name in removed:
        shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(data_dir)  # only if now empty
    return removed


def default_data_dir() -> str:
    """``$XDG_CACHE_HOME/air-transfer-bench``, else ``~/.cache/air-transfer-bench``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "air-transfer-bench")


# -- verification ------------------------------------------------------------------------


def timed_restore(checkpoint: Any, out: str) -> tuple[float, dict[str, Any]]:
    """``checkpoint.to_directory(out)`` (any ``ray.train.Checkpoint``, e.g. one in
    node storage): the seconds it took and the digest of what it wrote, which is
    then deleted."""
    start = time.perf_counter()
    checkpoint.to_directory(out)
    seconds = time.perf_counter() - start
    try:
        return seconds, tree_digest(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def tree_digest(root: str) -> dict[str, tuple[str, int, str]]:
    """``relative path -> (kind, size, xxh3 of the content)`` for every directory and
    file under ``root``; content is streamed, never held whole."""
    digest: dict[str, tuple[str, int, str]] = {}
    buffer = bytearray(8 * MiB)
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames:
            digest[os.path.normpath(os.path.join(rel, name))] = ("dir", 0, "")
        for name in filenames:
            digest[os.path.normpath(os.path.join(rel, name))] = _file_digest(
                os.path.join(dirpath, name), buffer
            )
    return digest


def _file_digest(path: str, buffer: bytearray) -> tuple[str, int, str]:
    h, size, view = xxhash.xxh3_64(), 0, memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
            size += n
    return "file", size, h.hexdigest()


def first_difference(expected: dict[str, Any], actual: dict[str, Any]) -> str | None:
    """A readable description of the first way ``actual`` differs, or None."""
    for path in sorted(expected.keys() | actual.keys()):
        want, got = expected.get(path), actual.get(path)
        if want != got:
            if got is None:
                return f"{path!r} is missing from the output"
            if want is None:
                return f"{path!r} is in the output but not in the source"
            return f"{path!r} differs: source {want[:2]}, output {got[:2]} (or content hash)"
    return None
