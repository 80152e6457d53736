"""The chunk checksum: xxh3-128 as hex, the one algorithm a manifest may name."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

CHECKSUM_ALGORITHM = "xxh3_128"
CHECKSUM_HEX_LEN = 32
_CHECKSUM_RE = re.compile(f"[0-9a-f]{{{CHECKSUM_HEX_LEN}}}")


def chunk_checksum(data: Buffer) -> str:
    """xxh3-128 of a chunk (any buffer), as hex. ~20 GB/s per core, so verification
    costs far less than the copy it protects (zlib.crc32 manages ~4 GB/s)."""
    return xxhash.xxh3_128_hexdigest(data)


def chunk_hasher() -> xxhash.xxh3_128:
    """A streaming xxh3-128: fed a chunk's bytes in order, its ``hexdigest()`` is
    ``chunk_checksum`` of the chunk (the writer hashes pieces as it writes them)."""
    return xxhash.xxh3_128()


def is_checksum(value: object) -> bool:
    """Whether ``value`` is a well-formed checksum (32 lowercase hex digits)."""
    return isinstance(value, str) and _CHECKSUM_RE.fullmatch(value) is not None
