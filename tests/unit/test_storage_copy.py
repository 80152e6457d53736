"""The same-node copy of node storage (``storage.copy.copy_tree``: Ray Train's report
and restore on the storage node) skips checksums, so every byte it writes is
compared here with its source (no Ray).

Its reads come from a read-ahead ring of three reused buffers while large files are
written around the page cache by a thread: a file whose size is 496 mod 512 bytes
before a large one puts the large file's chunks at addresses the direct writer takes
in place, and a write still queued from a buffer being refilled stored bytes of
later chunks, with no error. The mixes below hit that layout and its neighbours."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from air_transfer import TransferConfig
from air_transfer.core.direct_io import MIN_DIRECT_FILE_BYTES
from air_transfer.storage.copy import copy_tree
from tests.support.direct import skip_unless_o_direct
from tests.support.trees import assert_same_tree, write_file

MiB = 1024 * 1024
CHUNK = 2 * MiB  # many chunks per large file: the ring is refilled many times over

MIXES = {
    "config-1008-then-large": [1008, 24 * MiB],
    "496-then-large-then-small": [496, 20 * MiB, 1008, 4096],
    "two-large-after-odd-heads": [1520, MIN_DIRECT_FILE_BYTES, 3 * 512 + 496, 18 * MiB + 7],
    "aligned-control": [4096, 20 * MiB],
}


@pytest.mark.parametrize("sizes", MIXES.values(), ids=MIXES.keys())
def test_copy_tree_writes_every_byte_of_its_source(tmp_path: Path, sizes: list[int]) -> None:
    skip_unless_o_direct(tmp_path)
    source = tmp_path / "source"
    rng = random.Random(sum(sizes))
    for i, size in enumerate(sizes):  # names sort in this order: the stream's order
        write_file(source / f"{i:02d}.bin", rng.randbytes(size))
    for phase in ("upload", "download"):  # a report into storage, a restore from it
        target = tmp_path / phase
        copy_tree(str(source), str(target), TransferConfig(chunk_bytes=CHUNK), phase)
        assert_same_tree(source, target)
        for i in range(len(sizes)):
            name = f"{i:02d}.bin"
            assert (target / name).read_bytes() == (source / name).read_bytes(), name
