"""zstd for the codecs: the optional ``zstandard`` package (the ``[codec]`` extra),
imported when a codec first compresses or decompresses, and its contexts kept one per
thread (a ``ZstdCompressor`` or ``ZstdDecompressor`` must not be used by two threads
at once, and the drain encodes from several).

Two compression settings, both single-threaded (the figures are per core and the
drain already runs a thread per chunk):

- ``planes``: for the byte planes of numbers (``bytegroup``). A plane's bytes are
  close to independent draws (an exponent byte is one of a few dozen values), so
  what shrinks it is entropy coding of its literals, not matches: level 1 with a
  64-entry hash table and matches of 7 bytes at least finds almost none, and so
  runs ~2.5x faster than level 1 and ends 7% smaller (Huffman tables fitted to each
  128 KiB block). Measured on all-mpnet-base-v2 in bf16, the exponent plane of a
  32 MiB chunk: 0.343 of its size in 17 ms, against 0.371 in 43 ms at level 1 and
  0.426 in 92 ms at level 3; decoding 9 ms against 13-17 ms.
- ``generic``: zstd's own ``level`` for bytes that are not numbers (width 1).
"""

from __future__ import annotations

import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import zstandard

INSTALL_HINT = (
    "install air-transfer with its [codec] extra (pip install '.[codec]' in a clone), "
    "or zstandard alone"
)
#: Hash table of 2**6 entries and matches of 7 bytes or more: entropy coding only.
PLANE_HASH_LOG = 6
PLANE_MIN_MATCH = 7


def zstandard_module() -> ModuleType:
    """The ``zstandard`` package; ImportError with the command that installs it."""
    try:
        import zstandard
    except ImportError as e:
        raise ImportError(
            f"the bytegroup-zstd codec needs the zstandard package: {INSTALL_HINT} ({e})"
        ) from e
    return zstandard


class ZstdContexts:
    """Per-thread zstd contexts for one codec instance, created on first use."""

    def __init__(self, level: int) -> None:
        self.level = level
        self._local = threading.local()

    def _get(self) -> Any:
        state = self._local
        if not hasattr(state, "decompressor"):
            zstd = zstandard_module()
            plane_params = zstd.ZstdCompressionParameters.from_level(
                self.level, hash_log=PLANE_HASH_LOG, min_match=PLANE_MIN_MATCH, threads=0
            )
            state.planes = zstd.ZstdCompressor(compression_params=plane_params)
            state.generic = zstd.ZstdCompressor(level=self.level, threads=0)
            state.decompressor = zstd.ZstdDecompressor()
        return state

    def plane_compressor(self) -> zstandard.ZstdCompressor:
        compressor: zstandard.ZstdCompressor = self._get().planes
        return compressor

    def generic_compressor(self) -> zstandard.ZstdCompressor:
        compressor: zstandard.ZstdCompressor = self._get().generic
        return compressor

    def decompressor(self) -> zstandard.ZstdDecompressor:
        decompressor: zstandard.ZstdDecompressor = self._get().decompressor
        return decompressor
