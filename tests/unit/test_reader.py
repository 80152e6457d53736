"""``reader.ChunkFileReader``: a seekable stream over one file in a chunk stream.
Plain Python: the chunks come from a generator the test supplies."""

from __future__ import annotations

from collections.abc import Iterator

from air_transfer.core.reader import ChunkFileReader

CHUNK = 1024
DATA = bytes(range(256)) * 40  # ten chunks


def test_a_read_after_a_seek_tells_the_opener_where_it_ends() -> None:
    """A byte-range reader (torch DCP's, through node storage) must be able to fetch
    only the chunks of its range: the opener learns the chunk the read ends in,
    and a read that goes on sequentially opens nothing new."""
    opened: list[tuple[int, int]] = []

    def opener(first: int, last: int) -> Iterator[tuple[int, memoryview]]:
        opened.append((first, last))
        for i in range(first, len(DATA) // CHUNK):
            yield i, memoryview(DATA[i * CHUNK : (i + 1) * CHUNK])

    f = ChunkFileReader("f", len(DATA), 0, CHUNK, opener)
    f.seek(5000)
    assert f.read(3000) == DATA[5000:8000] and opened == [(4, 7)]
    f.seek(100)
    buffer = bytearray(50)
    assert f.readinto(buffer) == 50 and bytes(buffer) == DATA[100:150]
    assert opened[-1] == (0, 0)
    assert f.read(CHUNK) == DATA[150 : 150 + CHUNK] and len(opened) == 2
    f.seek(len(DATA) - 10)
    assert f.read(100) == DATA[-10:] and opened[-1] == (9, 9)
