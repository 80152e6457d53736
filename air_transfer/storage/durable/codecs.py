"""How the durable tier stores a file's bytes: the codec its record names, applied
chunk by chunk (so a ranged read decodes only its chunks). The one seam for it: the
drain encodes here, every reader (read-through, restores, ``verify``, ``cp``, the
scrub) decodes here; the codecs themselves are ``core.codec``'s registry.

``identity`` stores the bytes as they are (the tier is then plain files any reader
can use). With another codec a chunk is stored encoded when that makes it shorter,
else as it is: so a stored chunk is encoded exactly when it is shorter than its
raw length. A file whose first chunk does not shrink is stored as it is, whole
(its record says ``identity``). An unknown codec is an error, never read as raw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from air_transfer.core.codec import codecs, get_codec
from air_transfer.storage.durable.records import IDENTITY

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12


def known() -> tuple[str, ...]:
    """The codecs this air-transfer reads and writes."""
    return tuple(sorted(codecs))


def check(name: str) -> str:
    """``name`` if it is a registered codec; else ValueError (``CodecError``) naming
    the registered ones."""
    get_codec(name)
    return name


def encode(name: str, chunk: Buffer) -> Buffer | None:
    """``chunk`` as codec ``name`` stores it, or None where it would not shrink (the
    chunk is then stored as it is)."""
    if name == IDENTITY:
        return None
    return get_codec(name).encode(chunk)


def decode(name: str, stored: Buffer, raw_length: int) -> Buffer:
    """The ``raw_length`` bytes of a chunk stored by codec ``name``: the stored bytes
    themselves where they are that long (stored as they were), else decoded;
    ValueError if they cannot be (an unknown codec, bytes that do not decode to
    exactly ``raw_length``)."""
    size = len(memoryview(stored))
    if size == raw_length:
        return stored
    if name == IDENTITY or size > raw_length:
        raise ValueError(f"{size} stored bytes for a chunk of {raw_length} ({name})")
    return get_codec(name).decode(stored, raw_length)
