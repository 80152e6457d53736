"""Name -> codec: the codecs a file's record may name, each registered once.

Modelled on fsspec's ``registry.py``: a private dict, a read-only
``MappingProxyType`` view, and a ``register_codec`` that refuses to replace a codec
silently. The built-ins are registered here, in one place; creating them imports
nothing optional (``bytegroup-zstd`` imports zstandard when it first runs).
"""

from __future__ import annotations

from types import MappingProxyType

from air_transfer.core.codec.base import ChunkCodec
from air_transfer.core.codec.bytegroup import ByteGroupZstd
from air_transfer.core.codec.identity import IdentityCodec
from air_transfer.errors import CodecError

_registry: dict[str, ChunkCodec] = {}

#: Read-only view of the registered codecs, name -> codec.
codecs = MappingProxyType(_registry)


def register_codec(name: str, codec: ChunkCodec, clobber: bool = False) -> ChunkCodec:
    """Register ``codec`` (an instance, shared by every thread) under ``name``, the
    name a file's record will carry. ValueError if ``name`` is taken by another
    codec, unless ``clobber``; registering the same object again is a no-op.
    TypeError if ``codec`` is not a ``ChunkCodec`` or ``name`` not a non-empty str."""
    if not isinstance(codec, ChunkCodec):
        raise TypeError(f"register_codec expects a ChunkCodec instance, got {codec!r}")
    if not isinstance(name, str) or not name:
        raise TypeError(f"a codec's name must be a non-empty str, got {name!r}")
    existing = _registry.get(name)
    if existing is not None and existing is not codec and not clobber:
        raise ValueError(
            f"codec name {name!r} is already registered to {existing!r}; pass "
            "clobber=True to replace it (files recorded under it would then be read "
            "with the new one)"
        )
    _registry[name] = codec
    return codec


def get_codec(name: str) -> ChunkCodec:
    """The codec registered as ``name``; ``CodecError`` (a ValueError) naming the
    registered ones if none is."""
    try:
        return _registry[name]
    except KeyError:
        raise CodecError(
            f"unknown codec {name!r}; registered: {', '.join(sorted(_registry))} (a file "
            "written with a codec this process has not registered cannot be read here)"
        ) from None


for _builtin in (IdentityCodec(), ByteGroupZstd()):
    register_codec(_builtin.name, _builtin)
