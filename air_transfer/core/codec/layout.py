"""How ``bytegroup-zstd`` cuts a chunk into byte planes: one pure choice per chunk,
made on a sample so that it costs a few percent of encoding the chunk.

A chunk of a checkpoint file is mostly numbers of one width (bf16 and fp16: 2 bytes,
fp32: 4). Plane j holds the bytes at positions j, j + width, j + 2 * width... of
the chunk, so a tensor that starts at an odd offset (torch DCP writes each tensor
with ``torch.save`` wherever the file has reached) only swaps which plane holds its
exponent bytes: the planes are the same. What is chosen is the width: 1 (no
grouping, plain zstd: text, pickles, int8), 2 or 4. Each is tried on the same
sample, ``SAMPLE_SLICES`` slices spread over the chunk, each starting a multiple of
8 bytes from the chunk's start so that positions keep their place in an element;
the smallest estimate wins, a wider width only if ``WIDER_GAIN`` smaller. A plane
that does not shrink below ``COMPRESS_PLANE_BELOW`` on the sample (a mantissa byte:
near-random) is stored raw without compressing the chunk's. A chunk whose best
estimate saves less than ``min_saving`` is not encoded at all: this is how a file
that does not shrink is left off cheaply, on its first chunk's sample.

Tensors at different offsets in one chunk put their exponents in different planes;
zstd fits its Huffman tables per 128 KiB block, so each plane still shrinks where
it holds exponents.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from air_transfer.core.codec.planes import split_planes

#: Widths tried for every chunk, in order of preference on a tie.
CANDIDATES = (1, 2, 4)
SAMPLE_SLICES = 8
#: A wider layout must beat a narrower one by this fraction of its estimate: bf16
#: as width 4 (two exponent planes) estimates within a hair of width 2 and decodes
#: slower.
WIDER_GAIN = 0.01
#: A plane is compressed only if its sample shrinks below this fraction.
COMPRESS_PLANE_BELOW = 0.97
#: Sample slices start at multiples of this from the chunk's start (every width's).
_ALIGN = 8


@dataclass(frozen=True)
class Layout:
    """How to cut a chunk: elements of ``width`` bytes; per plane, whether to
    compress it (else it is stored raw)."""

    width: int
    compress: tuple[bool, ...]


def sample_of(chunk: memoryview, sample_bytes: int) -> memoryview:
    """``chunk`` itself if at most ``sample_bytes``, else ``SAMPLE_SLICES`` slices of
    it spread evenly, each a multiple of 8 bytes long starting at a multiple of 8."""
    if len(chunk) <= sample_bytes:
        return chunk
    piece = max(_ALIGN, sample_bytes // SAMPLE_SLICES // _ALIGN * _ALIGN)
    stride = (len(chunk) - piece) // (SAMPLE_SLICES - 1) // _ALIGN * _ALIGN
    slices = (chunk[i * stride : i * stride + piece] for i in range(SAMPLE_SLICES))
    return memoryview(b"".join(slices))


def choose_layout(
    chunk: memoryview,
    compressed_size: Callable[[memoryview, bool], int],
    sample_bytes: int,
    min_saving: float,
) -> Layout | None:
    """The layout of ``chunk`` (flat bytes) with the smallest estimated size, or None
    if none saves ``min_saving`` of the sample. ``compressed_size(data, is_plane)``
    is the compressed size of ``data``, a byte plane or (width 1) plain bytes."""
    sample = sample_of(chunk, sample_bytes)
    best: tuple[int, Layout] | None = None
    for width in CANDIDATES:
        if len(sample) < width:
            continue
        if width == 1:
            size = compressed_size(sample, False)
            layout, estimate = Layout(1, (size < len(sample),)), min(size, len(sample))
        else:
            planes = split_planes(sample, width)
            sizes = [compressed_size(memoryview(plane), True) for plane in planes]
            count = planes.shape[1]
            compress = tuple(s < COMPRESS_PLANE_BELOW * count for s in sizes)
            estimate = sum(s if c else count for s, c in zip(sizes, compress, strict=True))
            estimate += len(sample) - width * count
            layout = Layout(width, compress)
        if best is None or estimate < (1 - WIDER_GAIN) * best[0]:
            best = (estimate, layout)
    if best is None or best[0] > (1 - min_saving) * len(sample) or not any(best[1].compress):
        return None
    return best[1]
