"""The bytes of one ``bytegroup-zstd`` chunk: a header that says how to rebuild the
chunk, then its parts. Everything little-endian::

    magic       4  b"ATBG"
    version     1  FORMAT_VERSION; a reader refuses one it does not know
    width       1  bytes per element: 1 (bytes as they are), 2 or 4
    tail        1  bytes after the last whole element, kept raw (< width)
    count       8  elements, so the raw length is width * count + tail
    width x     9  per byte plane: method (0 raw, 1 zstd) and its stored length
    checksum    8  xxh3-64 of the header before it and of everything after it
    plane 0 .. plane width-1, tail bytes

The checksum makes a damaged chunk fail loudly: a flipped bit in a plane stored raw
would otherwise decode into wrong bytes without complaint. Every check raises
``CodecError`` naming what is wrong.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import xxhash

from air_transfer.errors import CodecError

if TYPE_CHECKING:
    from typing_extensions import Buffer

MAGIC = b"ATBG"
FORMAT_VERSION = 1
WIDTHS = (1, 2, 4)
RAW, ZSTD = 0, 1
_FIXED = struct.Struct("<4sBBBQ")  # magic, version, width, tail, count
_PLANE = struct.Struct("<BQ")  # method, stored length
_CHECKSUM = struct.Struct("<Q")


def header_length(width: int) -> int:
    """Bytes of the header of a chunk of elements of ``width`` bytes."""
    return _FIXED.size + width * _PLANE.size + _CHECKSUM.size


@dataclass(frozen=True)
class Frame:
    """A parsed chunk: its layout and, per byte plane, how and where it is stored."""

    width: int
    tail: int
    count: int
    #: Per plane: (method, offset in the encoded chunk, stored length).
    planes: tuple[tuple[int, int, int], ...]

    @property
    def raw_length(self) -> int:
        return self.width * self.count + self.tail

    @property
    def tail_offset(self) -> int:
        _method, offset, length = self.planes[-1]
        return offset + length


def pack(width: int, tail: Buffer, count: int, planes: Sequence[tuple[int, Buffer]]) -> bytes:
    """The encoded chunk: the header, then each plane's stored bytes (given as
    ``(method, bytes)``) and ``tail``, in one allocation."""
    parts: list[Buffer] = [*(data for _, data in planes), tail]
    header = _FIXED.pack(MAGIC, FORMAT_VERSION, width, len(memoryview(tail)), count)
    header += b"".join(_PLANE.pack(method, len(memoryview(data))) for method, data in planes)
    hasher = xxhash.xxh3_64(header)
    for part in parts:
        hasher.update(part)
    return b"".join([header, _CHECKSUM.pack(hasher.intdigest()), *parts])


def parse(view: memoryview, raw_length: int) -> Frame:
    """The frame of encoded chunk ``view`` (flat bytes), checked: magic, version,
    layout, lengths, checksum, and that it rebuilds exactly ``raw_length`` bytes."""
    if len(view) < _FIXED.size:
        raise CodecError(
            f"bytegroup-zstd chunk truncated: {len(view)} bytes, shorter than the "
            f"{_FIXED.size}-byte start of its header"
        )
    magic, version, width, tail, count = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise CodecError(
            f"not a bytegroup-zstd chunk: it starts with {bytes(magic)!r}, not {MAGIC!r} "
            "(stored raw, or by another codec than its record names?)"
        )
    if version != FORMAT_VERSION:
        raise CodecError(
            f"bytegroup-zstd chunk of format version {version}: this air-transfer reads "
            f"version {FORMAT_VERSION} only; read it with the release that wrote it or a newer one"
        )
    if width not in WIDTHS or tail >= width:
        raise CodecError(
            f"bad bytegroup-zstd header: width {width} (one of {WIDTHS}) and tail {tail} "
            "(under the width)"
        )
    start = header_length(width)
    if len(view) < start:
        raise CodecError(
            f"bytegroup-zstd chunk truncated: {len(view)} bytes, shorter than its "
            f"{start}-byte header"
        )
    planes = []
    offset = start
    for i in range(width):
        method, length = _PLANE.unpack_from(view, _FIXED.size + i * _PLANE.size)
        if method not in (RAW, ZSTD) or (method == RAW and length != count):
            raise CodecError(
                f"bad bytegroup-zstd header: plane {i} has method {method} and "
                f"{length} bytes for {count} elements"
            )
        planes.append((method, offset, length))
        offset += length
    if len(view) != offset + tail:
        state = "truncated" if len(view) < offset + tail else "longer than its header says"
        raise CodecError(
            f"bytegroup-zstd chunk {state}: {len(view)} bytes where its header adds up "
            f"to {offset + tail}"
        )
    checksum_at = start - _CHECKSUM.size
    hasher = xxhash.xxh3_64(view[:checksum_at])
    hasher.update(view[start:])
    if hasher.intdigest() != _CHECKSUM.unpack_from(view, checksum_at)[0]:
        raise CodecError(
            f"bytegroup-zstd chunk of {len(view)} bytes is damaged: its checksum does not "
            "match its bytes"
        )
    frame = Frame(width, tail, count, tuple(planes))
    if frame.raw_length != raw_length:
        raise CodecError(
            f"bytegroup-zstd chunk rebuilds {frame.raw_length} bytes where its record "
            f"says {raw_length}: the record and the chunk do not belong together"
        )
    return frame
