"""The interface of a chunk codec: how the durable tier may transform a file's bytes
on their way to the bucket, one chunk at a time.

A file is cut into chunks every ``chunk_bytes`` from its start (so a ranged read
decodes only the chunks it overlaps), and each chunk is encoded on its own. An
encoded chunk describes itself (its codec's header), so a reader needs only the
codec's name, which the file's record carries, as torch DCP records its
``StreamTransformExtension`` beside each item.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, ClassVar

import numpy as np

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


class ChunkCodec(abc.ABC):
    """A lossless transform of one chunk. Implementations are safe to call from
    several threads at once (the drain encodes from several)."""

    #: The name a file's record carries; the built-ins are registered under it.
    name: ClassVar[str]

    @abc.abstractmethod
    def encode(self, chunk: Buffer) -> bytes | None:
        """``chunk`` encoded, or None if encoding would not make it shorter: the
        caller then stores the chunk as it is. An encoded chunk is always strictly
        shorter than ``chunk``, so a reader knows a stored chunk is encoded exactly
        when its stored length is below its raw length."""

    @abc.abstractmethod
    def decode_into(self, encoded: Buffer, out: Buffer) -> None:
        """Decode ``encoded`` into ``out``, a writable buffer of exactly the chunk's
        raw length (a reader's reusable chunk buffer, or a slice of the file it
        restores). Raises ``CodecError`` (a ValueError) naming what is wrong with
        anything that does not decode to exactly ``len(out)`` bytes: truncated, a
        damaged header or payload, an unknown format version, another length. On an
        error ``out`` may hold anything; it never silently holds wrong bytes."""

    def decode(self, encoded: Buffer, raw_length: int) -> np.ndarray:
        """The ``raw_length`` bytes that ``encoded`` was made from, as a new uint8
        numpy array (the library's chunk type: zero-copy through Ray's object store).
        Errors as ``decode_into``."""
        out = np.empty(check_raw_length(raw_length), dtype=np.uint8)
        self.decode_into(encoded, out)
        return out


def byte_view(data: Buffer, what: str, writable: bool = False) -> memoryview:
    """``data`` as a flat view of unsigned bytes, without a copy; TypeError naming
    ``what`` if it is not a contiguous (and, if asked, writable) buffer."""
    view = memoryview(data)
    if writable and view.readonly:
        raise TypeError(f"{what} must be a writable buffer, got a read-only {type(data)!r}")
    if not view.c_contiguous:
        raise TypeError(f"{what} must be a contiguous buffer, got a strided {type(data)!r}")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


def check_raw_length(raw_length: object) -> int:
    """``raw_length`` if it is a non-negative int; TypeError/ValueError otherwise."""
    if isinstance(raw_length, bool) or not isinstance(raw_length, int):
        raise TypeError(f"raw_length must be an int, got {raw_length!r}")
    if raw_length < 0:
        raise ValueError(f"raw_length must be >= 0, got {raw_length}")
    return raw_length
