"""How the durable tier stores a file's bytes: the codec its record names, applied
chunk by chunk (so a ranged read decodes only its chunks). The one seam for it:
the drain encodes here, every reader decodes here.

``identity`` stores the bytes as they are (the tier is then plain files any reader
can use); another codec's name must be known to every reader of the tier, and an
unknown one is an error, never read as raw bytes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from air_transfer.storage.durable.records import IDENTITY

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


def known() -> tuple[str, ...]:
    """The codecs this air-transfer reads."""
    return (IDENTITY,)


def check(name: str) -> str:
    """``name`` if it is a codec this air-transfer writes and reads; else ValueError."""
    if name not in known():
        raise ValueError(f"unknown durable-tier codec {name!r}; known: {', '.join(known())}")
    return name


def encode(name: str, chunk: Buffer) -> Buffer | None:
    """``chunk`` as codec ``name`` stores it; None where it stores it as it is."""
    check(name)
    return None


def stored_raw(name: str, chunk: Buffer) -> Buffer:
    """``chunk`` framed by codec ``name`` as stored without compression (a chunk of a
    compressed file that does not shrink)."""
    check(name)
    return chunk


def decode(name: str, stored: Buffer, raw_length: int) -> Buffer:
    """The ``raw_length`` bytes of a chunk stored by codec ``name``; ValueError if
    they cannot be (an unknown codec, bytes that do not decode)."""
    check(name)
    if len(memoryview(stored)) != raw_length:
        raise ValueError(f"{len(memoryview(stored))} stored bytes for a chunk of {raw_length}")
    return stored
