"""The durable tier's chunk codecs round-trip every byte: one contract every
registered codec passes (arbitrary bytes, empty, one byte, weights of each dtype at
any offset), the byte grouping's choices (width, lead, raw planes, chunks left
raw) and what it saves, and a codec shared by threads that encode and decode at
once. Malformed input is in ``test_codec_malformed.py``."""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from air_transfer.core.codec import ByteGroupZstd, ChunkCodec, codecs
from air_transfer.core.codec.frame import RAW, WIDTHS, ZSTD, pack, parse
from air_transfer.core.codec.planes import split_planes
from tests.support.floats import DTYPES, WIDTH, weights

#: Every chunk the contract encodes with each codec, by name.
CONTRACT_CHUNKS = {
    "empty": b"",
    "one byte": b"\x07",
    "random": os.urandom(100_003),
    "text": b"optimizer.state.step " * 5000,
    "zeros": bytes(70_001),
}
CONTRACT_CHUNKS.update(
    (f"{d} at offset {offset}", b"\x01\x02\x03"[:offset] + weights(d, 50_001, seed=offset))
    for d in DTYPES
    for offset in (0, 1, 3)
)


def round_trip(codec: ChunkCodec, chunk: bytes) -> bytes | None:
    """``chunk`` encoded (None if stored raw), after checking that both ways of
    decoding give ``chunk`` back and that an encoding is strictly shorter."""
    encoded = codec.encode(chunk)
    if encoded is None:
        return None
    assert len(encoded) < len(chunk)
    assert codec.decode(encoded, len(chunk)).tobytes() == chunk
    out = bytearray(b"\xff" * len(chunk))
    codec.decode_into(encoded, out)
    assert out == chunk
    return encoded


@pytest.mark.parametrize("name", sorted(codecs))
@pytest.mark.parametrize("chunk_name", sorted(CONTRACT_CHUNKS))
def test_every_codec_gives_every_chunk_back(name: str, chunk_name: str) -> None:
    round_trip(codecs[name], CONTRACT_CHUNKS[chunk_name])


@pytest.mark.parametrize("name", sorted(codecs))
def test_every_codec_takes_any_contiguous_buffer(name: str) -> None:
    """A numpy array of any dtype is a chunk, a bytearray or memoryview an encoded
    one (a stored raw chunk, for ``identity``)."""
    chunk = np.frombuffer(weights("bf16", 40_000), dtype=np.uint16)
    stored = codecs[name].encode(chunk) or chunk.tobytes()
    decoded = codecs[name].decode(memoryview(bytearray(stored)), chunk.nbytes)
    assert decoded.tobytes() == chunk.tobytes()


@given(data=st.binary(max_size=5000), repeat=st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_bytegroup_round_trips_arbitrary_bytes(data: bytes, repeat: int) -> None:
    """Repeated, so that most examples shrink and take the encoded path."""
    encoded = round_trip(ByteGroupZstd(min_saving=0.0), data * repeat)
    event("stored raw" if encoded is None else "encoded")


@given(
    dtype=st.sampled_from(DTYPES),
    count=st.integers(0, 3000),
    head=st.binary(max_size=3),
    tail=st.binary(max_size=3),
    scale=st.sampled_from([1e-3, 0.02, 1.0, 300.0]),
)
@settings(max_examples=150, deadline=None)
def test_bytegroup_round_trips_weights_at_any_offset(
    dtype: str, count: int, head: bytes, tail: bytes, scale: float
) -> None:
    chunk = head + weights(dtype, count, seed=count, scale=scale) + tail
    encoded = round_trip(ByteGroupZstd(min_saving=0.0, sample_bytes=4096), chunk)
    width = None if encoded is None else parse(memoryview(encoded), len(chunk)).width
    event(f"width {width}" if width else "stored raw")


@given(
    data=st.binary(max_size=3000),
    width=st.sampled_from(WIDTHS),
    zstd_planes=st.lists(st.booleans(), min_size=4, max_size=4),
)
@settings(max_examples=200, deadline=None)
def test_every_layout_the_format_allows_decodes(
    data: bytes, width: int, zstd_planes: list[bool]
) -> None:
    """Layouts the chooser would not pick (any width, any plane raw or compressed,
    no whole element at all) decode all the same."""
    import zstandard

    view = memoryview(data)
    count = len(data) // width
    stored = [
        (ZSTD, zstandard.ZstdCompressor().compress(plane)) if z else (RAW, plane)
        for plane, z in zip(split_planes(view, width), zstd_planes, strict=False)
    ]
    encoded = pack(width, view[width * count :], count, stored)
    assert parse(memoryview(encoded), len(data)).width == width
    assert ByteGroupZstd().decode(encoded, len(data)).tobytes() == data


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_bytegroup_groups_weights_by_their_width_at_any_offset(dtype: str, offset: int) -> None:
    """The element width of the dtype, wherever the first element starts (a tensor
    in a torch DCP file starts at any offset): the plane of exponent bytes is
    compressed and the plane of the mantissa's low bytes stored raw, not compressed
    in vain, and the chunk shrinks as much as if it started on an element."""
    width = WIDTH[dtype]
    aligned = weights(dtype, 200_000)
    chunk = os.urandom(offset) + aligned
    encoded = round_trip(ByteGroupZstd(), chunk)
    assert encoded is not None
    frame = parse(memoryview(encoded), len(chunk))
    assert frame.width == width
    methods = [method for method, _, _ in frame.planes]
    assert methods[(width - 1 + offset) % width] == ZSTD  # sign and exponent
    assert methods[offset % width] == RAW  # the mantissa's low byte
    reference = ByteGroupZstd().encode(aligned)
    assert reference is not None and len(encoded) <= len(reference) + 64


@pytest.mark.parametrize(("dtype", "at_least"), [("bf16", 0.25), ("fp16", 0.10), ("fp32", 0.10)])
def test_bytegroup_saves_more_than_plain_zstd_on_weights(dtype: str, at_least: float) -> None:
    """Grouping the exponent bytes is what shrinks weights: a quarter of bf16 and
    more than plain zstd of the same bytes saves (sizes, deterministic)."""
    import zstandard

    chunk = weights(dtype, 1_000_000)
    encoded = round_trip(ByteGroupZstd(), chunk)
    assert encoded is not None
    assert len(encoded) <= (1 - at_least) * len(chunk)
    assert len(encoded) < len(zstandard.ZstdCompressor(level=1).compress(chunk))


def test_bytegroup_keeps_text_ungrouped_and_leaves_random_bytes_raw() -> None:
    text = CONTRACT_CHUNKS["text"]
    encoded = round_trip(ByteGroupZstd(), text)
    assert encoded is not None and parse(memoryview(encoded), len(text)).width == 1
    assert ByteGroupZstd().encode(os.urandom(1_000_000)) is None


def test_a_chunk_that_saves_less_than_min_saving_is_left_raw() -> None:
    """Half random, half zeros saves ~50%: encoded under a 40% minimum, not a 60% one."""
    chunk = os.urandom(100_000) + bytes(100_000)
    assert round_trip(ByteGroupZstd(min_saving=0.4), chunk) is not None
    assert ByteGroupZstd(min_saving=0.6).encode(chunk) is None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"level": 0}, "level"), ({"level": 23}, "level"), ({"sample_bytes": 8}, "sample_bytes"),
     ({"min_saving": 1.0}, "min_saving"), ({"min_saving": -0.1}, "min_saving")],
)  # fmt: skip
def test_bytegroup_settings_are_checked(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ByteGroupZstd(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", sorted(codecs))
def test_a_strided_or_read_only_buffer_is_refused_with_a_type_error(name: str) -> None:
    strided = np.arange(100, dtype=np.uint8)[::2]
    with pytest.raises(TypeError, match="contiguous"):
        codecs[name].encode(strided)
    with pytest.raises(TypeError, match="writable"):
        codecs[name].decode_into(b"x", b"y")


def test_one_codec_encodes_and_decodes_from_several_threads_at_once() -> None:
    """zstd's contexts are not thread-safe and the drain encodes from several threads:
    each thread round-trips its own chunks through one shared codec while the others
    do (the calls' intervals are checked to have overlapped), and every byte comes
    back."""
    codec = ByteGroupZstd()
    chunks = [weights(d, 400_000, seed=i) for i, d in enumerate(DTYPES * 2)]
    start = threading.Barrier(len(chunks))
    spans: list[tuple[int, float, float]] = []
    failures: list[str] = []

    def work(i: int) -> None:
        start.wait()
        for _ in range(6):
            began = time.perf_counter()
            encoded = codec.encode(chunks[i])
            decoded = codec.decode(encoded, len(chunks[i])) if encoded else None
            spans.append((i, began, time.perf_counter()))
            if encoded is None or decoded is None or decoded.tobytes() != chunks[i]:
                failures.append(f"thread {i}: chunk did not round-trip")

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(chunks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    overlapping = sum(
        1 for a, b0, b1 in spans for c, d0, d1 in spans if a < c and b0 < d1 and d0 < b1
    )
    assert overlapping > 0, "no two threads were ever inside the codec at once"
    assert failures == []
