"""Helpers for the tests of live-chunk reuse (``TransferConfig(reuse_chunks=True)``):
a tree of whole-chunk files, a transfer and the ids of its chunks (a reused chunk is
the earlier transfer's object, so reuse is read off the refs), and the node agent's
counts of the bytes it packed and reused."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import ray

from air_transfer import ChunkedCheckpoint, TransferConfig
from air_transfer.cluster.nodes import node_agent
from air_transfer.config import KiB

CHUNK = 64 * KiB
REUSE = TransferConfig(chunk_bytes=CHUNK, strategy="chunked", owner="node", reuse_chunks=True)
FILES = ("a.bin", "b.bin", "c.bin", "w.bin")  # two chunks each, stream order
PER_FILE = 2
ALL = len(FILES) * PER_FILE


def make_tree(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    for name in FILES:
        (src / name).write_bytes(os.urandom(PER_FILE * CHUNK))
    return src


def chunk_ids(ref: Any) -> list[str]:
    """The hex ids of the chunk objects of the transfer at ``ref``."""
    return [chunk.hex() for chunk in ray.get(ref).handle().payload]


def transfer(src: Path, config: TransferConfig = REUSE) -> tuple[Any, list[str]]:
    """The ref of a transfer of ``src`` (packed; hold it to keep the transfer live in
    the agent), and the hex ids of its chunks."""
    ref = ChunkedCheckpoint.from_directory(str(src)).to_object_ref(config)
    return ref, chunk_ids(ref)


def same(one: list[str], two: list[str]) -> set[int]:
    """The chunk indices at which two transfers share the object."""
    return {i for i, (a, b) in enumerate(zip(one, two, strict=True)) if a == b}


def counters() -> dict[str, int]:
    """The node agent's ``bytes_packed``, ``chunks_reused``, ``bytes_reused``..."""
    counts: dict[str, int] = ray.get(node_agent().read_counters.remote())
    return counts


def chunks_of(names: set[str]) -> set[int]:
    """The chunk indices of the files ``names``."""
    return {FILES.index(n) * PER_FILE + k for n in names for k in range(PER_FILE)}


def restored(ref: Any, tmp_path: Path, name: str) -> Path:
    return Path(ray.get(ref).to_directory(str(tmp_path / name)))
