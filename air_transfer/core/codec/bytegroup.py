"""``bytegroup-zstd``: byte grouping of numbers, then zstd (as ZipNN compresses model
weights).

The bytes of a float tensor look random to a compressor because every element mixes
a sign, an exponent and a mantissa; the exponents of trained weights, though, take
a few dozen values. Grouping byte j of every element into plane j (a bf16 tensor
becomes a plane of mantissa bytes and a plane of sign-and-exponent bytes) leaves
the exponent plane to zstd's entropy coder, which brings it to about a third, and
the near-random mantissa plane raw. ``layout`` picks the width per chunk,
``frame`` is the encoded chunk's format, ``zstd_contexts`` the compressors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import numpy as np

from air_transfer.core.codec.base import ChunkCodec, byte_view
from air_transfer.core.codec.frame import RAW, ZSTD, header_length, pack, parse
from air_transfer.core.codec.layout import Layout, choose_layout
from air_transfer.core.codec.planes import merge_planes, split_planes
from air_transfer.core.codec.zstd_contexts import ZstdContexts, zstandard_module
from air_transfer.errors import CodecError

if TYPE_CHECKING:
    from typing_extensions import Buffer

KiB = 1024


class ByteGroupZstd(ChunkCodec):
    """Byte planes of 1, 2 or 4 bytes per element, each zstd-compressed or raw.

    ``level``: zstd's level (1: the measured best for planes, see ``zstd_contexts``);
    ``sample_bytes``: the sample the layout is chosen on; ``min_saving``: the
    fraction of a chunk's sample that encoding must save, else the chunk is stored
    raw (decoding costs CPU at every read: a few percent is not worth it).
    """

    name: ClassVar[str] = "bytegroup-zstd"

    def __init__(
        self, level: int = 1, sample_bytes: int = 256 * KiB, min_saving: float = 0.03
    ) -> None:
        if not 1 <= level <= 22:
            raise ValueError(f"zstd level must be 1..22, got {level}")
        if sample_bytes < 64:
            raise ValueError(f"sample_bytes must be >= 64, got {sample_bytes}")
        if not 0 <= min_saving < 1:
            raise ValueError(f"min_saving must be in [0, 1), got {min_saving}")
        self.sample_bytes = sample_bytes
        self.min_saving = min_saving
        self._zstd = ZstdContexts(level)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(level={self._zstd.level}, sample_bytes="
            f"{self.sample_bytes}, min_saving={self.min_saving})"
        )

    def _compressed_size(self, data: memoryview, is_plane: bool) -> int:
        return len(self._compress(data, is_plane))

    def _compress(self, data: memoryview, is_plane: bool) -> bytes:
        zstd = self._zstd.plane_compressor() if is_plane else self._zstd.generic_compressor()
        return zstd.compress(data)

    def encode(self, chunk: Buffer) -> bytes | None:
        view = byte_view(chunk, "chunk")
        if len(view) <= header_length(1):
            return None
        layout = choose_layout(view, self._compressed_size, self.sample_bytes, self.min_saving)
        if layout is None:
            return None
        encoded = self._encode(view, layout)
        return encoded if len(encoded) < len(view) else None

    def _encode(self, view: memoryview, layout: Layout) -> bytes:
        width = layout.width
        count = len(view) // width
        end = width * count
        rows: list[memoryview | np.ndarray] = (
            [view[:end]] if width == 1 else list(split_planes(view, width))
        )
        stored: list[tuple[int, Buffer]] = []
        for row, compress in zip(rows, layout.compress, strict=True):
            packed = self._compress(memoryview(row), width > 1) if compress else None
            stored.append((RAW, row) if packed is None or len(packed) >= count else (ZSTD, packed))
        return pack(width, view[end:], count, stored)

    def decode_into(self, encoded: Buffer, out: Buffer) -> None:
        view = byte_view(encoded, "encoded")
        target = np.frombuffer(byte_view(out, "out", writable=True), dtype=np.uint8)
        frame = parse(view, len(target))
        end = frame.width * frame.count
        target[end:] = np.frombuffer(view, np.uint8, frame.tail, frame.tail_offset)
        if frame.count == 0:
            return
        planes = [
            np.frombuffer(view, np.uint8, frame.count, offset)
            if method == RAW
            else self._decompress(view[offset : offset + length], frame.count, j)
            for j, (method, offset, length) in enumerate(frame.planes)
        ]
        merge_planes(planes, target[:end])

    def _decompress(self, stored: memoryview, count: int, plane: int) -> np.ndarray:
        zstd = zstandard_module()
        try:
            # Checked before decompressing: a frame's own size decides the allocation.
            size = zstd.frame_content_size(stored)
            if size != count:
                held = "an unknown number of" if size < 0 else str(size)
                raise CodecError(
                    f"bytegroup-zstd plane {plane} holds a zstd frame of {held} bytes, not {count}"
                )
            data = self._zstd.decompressor().decompress(stored, allow_extra_data=False)
        except zstd.ZstdError as e:
            raise CodecError(
                f"bytegroup-zstd plane {plane} ({len(stored)} bytes) does not decompress: {e}"
            ) from e
        if len(data) != count:
            raise CodecError(
                f"bytegroup-zstd plane {plane} decompresses to {len(data)} bytes, not {count}"
            )
        return np.frombuffer(data, dtype=np.uint8)
