"""A chunk codec refuses, with a ``CodecError`` (a ValueError) naming what is wrong,
anything that would not decode to exactly the bytes that were encoded: truncated,
longer, a flipped byte anywhere, a format version it does not read, a record's
length that is not the chunk's, a header or a zstd plane made inconsistent under a
valid checksum; and the registry names what it knows and refuses a clash."""

from __future__ import annotations

import struct
import sys
from types import MappingProxyType

import pytest
import xxhash

from air_transfer.core.codec import ByteGroupZstd, ChunkCodec, IdentityCodec, codecs, get_codec
from air_transfer.core.codec import register_codec as register
from air_transfer.core.codec.frame import RAW, ZSTD, header_length, pack
from air_transfer.core.codec.registry import _registry
from air_transfer.errors import CodecError
from tests.support.floats import weights

#: bf16 at an even offset, one byte after the last element: plane 0 (the mantissa's
#: low bytes) stored raw, plane 1 (sign and exponent) zstd, a tail of 1.
CHUNK = b"\x00\x01" + weights("bf16", 20_000) + b"\x07"
CODEC = ByteGroupZstd()


@pytest.fixture(scope="module")
def encoded() -> bytes:
    out = CODEC.encode(CHUNK)
    assert out is not None and out[5:7] == b"\x02\x01" and (out[15], out[24]) == (RAW, ZSTD)
    return out


def resealed(chunk: bytearray) -> bytes:
    """``chunk`` with its checksum made right again, so that a check behind the
    checksum is what must catch the change."""
    width = chunk[5]
    at = header_length(width) - 8
    digest = xxhash.xxh3_64(bytes(chunk[:at]))
    digest.update(bytes(chunk[at + 8 :]))
    chunk[at : at + 8] = struct.pack("<Q", digest.intdigest())
    return bytes(chunk)


def test_every_truncation_is_refused(encoded: bytes) -> None:
    for length in [*range(0, 80), *range(len(encoded) - 40, len(encoded))]:
        with pytest.raises(CodecError, match=r"truncated|damaged"):
            CODEC.decode(encoded[:length], len(CHUNK))


def test_trailing_bytes_are_refused(encoded: bytes) -> None:
    with pytest.raises(CodecError, match="longer than its header says"):
        CODEC.decode(encoded + b"\x00", len(CHUNK))


def test_a_flipped_bit_anywhere_is_refused(encoded: bytes) -> None:
    """Each header byte, and bytes spread over the planes (the raw plane too, where
    nothing but the checksum would notice)."""
    positions = [*range(header_length(2)), *range(header_length(2), len(encoded), 997)]
    for at in positions:
        damaged = bytearray(encoded)
        damaged[at] ^= 0x10
        with pytest.raises(CodecError, match=r"not a bytegroup|version|bad .*header|truncated|"
                           r"longer|damaged"):  # fmt: skip
            CODEC.decode(bytes(damaged), len(CHUNK))


@pytest.mark.parametrize("raw_length", [0, len(CHUNK) - 1, len(CHUNK) + 1, 2 * len(CHUNK)])
def test_a_record_length_other_than_the_chunk_is_refused(encoded: bytes, raw_length: int) -> None:
    with pytest.raises(CodecError, match=f"rebuilds {len(CHUNK)} bytes where its record says"):
        CODEC.decode(encoded, raw_length)


def test_another_format_version_is_refused_by_name(encoded: bytes) -> None:
    newer = bytearray(encoded)
    newer[4] = 2
    with pytest.raises(CodecError, match="format version 2: this air-transfer reads version 1"):
        CODEC.decode(resealed(newer), len(CHUNK))


def test_a_chunk_of_another_codec_is_refused(encoded: bytes) -> None:
    with pytest.raises(CodecError, match="not a bytegroup-zstd chunk"):
        CODEC.decode(CHUNK, len(CHUNK))


@pytest.mark.parametrize(
    ("at", "value", "message"),
    [
        (5, 3, "width 3"),  # not a width
        (6, 2, "tail 2"),  # tail not under the width
        (15, 7, "plane 0 has method 7"),  # unknown method
        (15, ZSTD, "plane 0 .* does not decompress"),  # a raw plane called zstd
        (24, RAW, "plane 1 has method 0 and"),  # a zstd plane called raw: wrong length
    ],
)
def test_a_header_that_lies_under_a_valid_checksum_is_refused(
    encoded: bytes, at: int, value: int, message: str
) -> None:
    lying = bytearray(encoded)
    lying[at] = value
    with pytest.raises(CodecError, match=message):
        CODEC.decode(resealed(lying), len(CHUNK))


@pytest.mark.parametrize(
    ("frame_size", "message"),
    [(1, "plane 1 holds a zstd frame of 1 bytes, not 2"),
     (None, "plane 1 holds a zstd frame of an unknown number of bytes, not 2")],
)  # fmt: skip
def test_a_zstd_plane_of_another_length_is_refused(frame_size: int | None, message: str) -> None:
    """A well-formed zstd frame that holds one byte too few for its plane, or does
    not say how many (refused before decompressing: its size would be a guess)."""
    import zstandard

    compressor = zstandard.ZstdCompressor(write_content_size=frame_size is not None)
    planes = [(RAW, b"ab"), (ZSTD, compressor.compress(b"cd"[: frame_size or 2]))]
    with pytest.raises(CodecError, match=message):
        CODEC.decode(pack(2, b"", 2, planes), 4)


def test_identity_refuses_another_length() -> None:
    with pytest.raises(CodecError, match="identity chunk of 3 bytes where its record says 4"):
        IdentityCodec().decode(b"abc", 4)
    with pytest.raises(CodecError, match="longer than recorded"):
        IdentityCodec().decode(b"abcde", 4)


@pytest.mark.parametrize("raw_length", [-1, 1.5, True, "4"])
def test_a_raw_length_that_is_no_length_is_refused(raw_length: object) -> None:
    with pytest.raises((TypeError, ValueError), match="raw_length"):
        CODEC.decode(b"", raw_length)  # type: ignore[arg-type]


def test_without_zstandard_the_codec_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, encoded: bytes
) -> None:
    """A fresh codec (no contexts yet) in a process where ``import zstandard`` fails."""
    monkeypatch.setitem(sys.modules, "zstandard", None)
    for call in (lambda c: c.encode(CHUNK), lambda c: c.decode(encoded, len(CHUNK))):
        with pytest.raises(ImportError, match=r"pip install '\.\[codec\]'"):
            call(ByteGroupZstd())


# -- the registry ------------------------------------------------------------------------


def test_the_builtins_are_registered_under_their_names_in_a_read_only_view() -> None:
    assert isinstance(codecs, MappingProxyType)
    assert type(codecs["identity"]) is IdentityCodec and codecs["identity"].name == "identity"
    assert type(codecs["bytegroup-zstd"]) is ByteGroupZstd
    assert codecs["bytegroup-zstd"].name == "bytegroup-zstd"
    with pytest.raises(TypeError):
        codecs["mine"] = IdentityCodec()  # type: ignore[index]


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    known = "registered: bytegroup-zstd, identity"
    with pytest.raises(CodecError, match=f"unknown codec 'lz4'; {known}"):
        get_codec("lz4")


@pytest.fixture
def clean_registry() -> object:
    saved = dict(_registry)
    yield
    _registry.clear()
    _registry.update(saved)


@pytest.mark.usefixtures("clean_registry")
def test_a_taken_name_is_refused_unless_clobbered() -> None:
    mine = ByteGroupZstd(level=3)
    with pytest.raises(ValueError, match="'bytegroup-zstd' is already registered to ByteGroupZstd"):
        register("bytegroup-zstd", mine)
    assert get_codec("bytegroup-zstd") is not mine
    assert register("bytegroup-zstd", get_codec("bytegroup-zstd")) is codecs["bytegroup-zstd"]
    register("bytegroup-zstd", mine, clobber=True)
    assert get_codec("bytegroup-zstd") is mine
    register("bytegroup-zstd-3", mine)
    assert get_codec("bytegroup-zstd-3") is mine


@pytest.mark.usefixtures("clean_registry")
@pytest.mark.parametrize(("name", "codec"), [("x", ByteGroupZstd), ("", IdentityCodec()),
                                             (None, IdentityCodec())])  # fmt: skip
def test_only_a_codec_instance_under_a_name_registers(name: object, codec: object) -> None:
    with pytest.raises(TypeError, match=r"ChunkCodec instance|non-empty str"):
        register(name, codec)  # type: ignore[arg-type]
    assert "x" not in codecs and "" not in codecs


def test_a_codec_is_a_chunk_codec_with_a_name() -> None:
    assert all(isinstance(c, ChunkCodec) and isinstance(c.name, str) for c in codecs.values())
