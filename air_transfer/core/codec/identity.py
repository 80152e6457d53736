"""``identity``: bytes stored as they are, the codec of a file the durable tier does
not transform (and of every file written before codecs existed)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from air_transfer.core.codec.base import ChunkCodec, byte_view
from air_transfer.errors import CodecError

if TYPE_CHECKING:
    from typing_extensions import Buffer


class IdentityCodec(ChunkCodec):
    """Never encodes (``encode`` is always None); ``decode`` checks the length."""

    name: ClassVar[str] = "identity"

    def encode(self, chunk: Buffer) -> bytes | None:
        byte_view(chunk, "chunk")
        return None

    def decode_into(self, encoded: Buffer, out: Buffer) -> None:
        view = byte_view(encoded, "encoded")
        target = byte_view(out, "out", writable=True)
        if len(view) != len(target):
            state = "truncated" if len(view) < len(target) else "longer than recorded"
            raise CodecError(
                f"identity chunk of {len(view)} bytes where its record says {len(target)}: {state}"
            )
        target[:] = view
