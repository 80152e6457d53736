"""Byte planes: byte j of every element gathered into plane j, and back. numpy's
copies, picked by measurement (32 MiB of bf16 on this project's 2-core VM): for
width 2 a uint16 view shifted and narrowed, 15-20 ms to split and ~12 ms to merge
into a fresh buffer, against ~36 ms and ~16 ms for the strided copies that serve
width 4 (a uint32 view takes more passes than it saves).
"""

from __future__ import annotations

import numpy as np

#: Little-endian whatever the machine: plane 0 is the element's first byte.
_LE16 = np.dtype("<u2")


def split_planes(data: memoryview, width: int) -> np.ndarray:
    """The whole elements of ``data`` as a (width, count) array: row j holds byte j
    of every element (little-endian: row ``width - 1`` holds the sign and exponent
    bits of an aligned float)."""
    count = len(data) // width
    body = np.frombuffer(data, dtype=np.uint8, count=count * width)
    if width == 2:
        words = body.view(_LE16)
        planes = np.empty((2, count), dtype=np.uint8)
        np.copyto(planes[0], words, casting="unsafe")
        np.copyto(planes[1], words >> 8, casting="unsafe")
        return planes
    return body.reshape(count, width).T.copy()


def merge_planes(planes: list[np.ndarray], body: np.ndarray) -> None:
    """Interleave ``planes`` (each ``count`` bytes) into ``body`` (``len(planes) x
    count`` bytes): the inverse of ``split_planes``."""
    width, count = len(planes), len(planes[0])
    if width == 2:
        words = body.view(_LE16)
        np.left_shift(planes[1], 8, out=words, dtype=np.uint16)
        np.bitwise_or(words, planes[0], out=words)
        return
    elements = body.reshape(count, width)
    for j, plane in enumerate(planes):
        elements[:, j] = plane
