"""Optional lossless codecs for the durable tier, one chunk at a time.

A file is encoded in chunks cut every ``chunk_bytes`` from its start; each encoded
chunk describes itself, so a reader needs only the codec's name from the file's
record: ``get_codec(name).decode(stored, raw_length)``. ``encode`` returns None for a
chunk that would not shrink (store it raw: its stored length is then its raw
length, so a reader decodes a chunk exactly when it is stored shorter). Built in:

- ``identity``: bytes as they are.
- ``bytegroup-zstd``: byte planes of 2- or 4-byte numbers, each zstd-compressed
  (needs the ``[codec]`` extra: ``zstandard``); about a third fewer bytes on bf16
  weights, decoded at over 1 GB/s per core (docs/performance.md, "Codec").
"""

from air_transfer.core.codec.base import ChunkCodec
from air_transfer.core.codec.bytegroup import ByteGroupZstd
from air_transfer.core.codec.identity import IdentityCodec
from air_transfer.core.codec.registry import codecs, get_codec, register_codec

__all__ = [
    "ByteGroupZstd",
    "ChunkCodec",
    "IdentityCodec",
    "codecs",
    "get_codec",
    "register_codec",
]
