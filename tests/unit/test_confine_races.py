"""Node storage against an attacker on the storage node: while the calls run in a loop,
a thread flips a directory on the way of every path between a real directory and a
symlink to a directory outside the root (one atomic exchange at a time). Defect: the
storage-node writes, Train's report and restore hooks and the agent's directory
transfers checked a path, then acted on it by path again, so a flip in between led
them out of the root: files created outside, checkpoints published outside, outside
files read and handed out.

Whatever the interleaving, nothing outside may be created, changed or read: every
call acts inside the root, or fails with a clear error (the path led outside when it
was resolved: PermissionError; caught mid-flip: FileNotFoundError,
NotADirectoryError, or ELOOP once re-resolving kept meeting a change). The outside
directory mirrors the inside one, same names and sizes, so that a call led there
would find what it expects."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from air_transfer import TransferConfig
from air_transfer.core.packer import ChunkPacker
from air_transfer.core.plan import ChunkPlan
from air_transfer.core.proven_read import read_chunks
from air_transfer.core.scan import Source, scan
from air_transfer.storage.client.same_node import open_native
from air_transfer.storage.server.chunk_cache import FileChunks
from air_transfer.storage.server.directory_transfers import DirectoryTransfers
from air_transfer.storage.server.reads import read_stored_chunks
from tests.support.attack import (
    CHUNK,
    ITERATIONS,
    SIZE,
    Attack,
    Disk,
    attacked,
    make_attack,
    no_secret,
)


@pytest.fixture
def attack(tmp_path: Path) -> Attack:
    return make_attack(tmp_path)


def test_metadata_and_file_reads_stay_inside(attack: Attack) -> None:
    """Every other operation of the storage node (metadata, file reads, copies): each
    acts inside or is refused."""
    disk, r = Disk(), attack.r

    def calls(i: int) -> None:
        no_secret(open_native(r, f"{r}/d/f").read())
        no_secret(b"".join(bytes(c) for c in read_stored_chunks(r, f"{r}/d/f", SIZE, CHUNK, 0)))
        no_secret([rel for rel, *_ in disk.fs_list(r, f"{r}/d", True, False)])
        disk.fs_info(r, [f"{r}/d/f", f"{r}/d/ckpt"])
        disk.fs_create_dir(r, f"{r}/d/exp/m{i}/x", True)
        disk.fs_move(r, f"{r}/d/exp/m{i}", f"{r}/d/exp/n{i}")
        disk.fs_copy_file(r, f"{r}/d/f", f"{r}/d/exp/n{i}/c")
        disk.fs_delete_file(r, f"{r}/d/exp/n{i}/c")
        disk.fs_delete_dir_contents(r, f"{r}/d/exp/n{i}", False)
        disk.fs_delete_dir(r, f"{r}/d/exp/n{i}")

    attacked(attack, calls, ITERATIONS // 2)


class Packer:
    """Packs in this process what the agent would pack in its own tasks."""

    def __call__(self, source: Source, plans: Iterable[ChunkPlan]) -> tuple[list[Any], list[Any]]:
        chunks, checksums = ChunkPacker().pack(source, list(plans))
        return [bytes(c) for c in chunks], checksums


def test_file_chunks_for_other_nodes_are_read_inside(attack: Attack) -> None:
    """A file's chunks packed for readers on other nodes (``chunk_cache.FileChunks``)."""
    r = attack.r

    def read(i: int) -> None:
        pairs = FileChunks(Packer()).refs(r, f"{r}/d/f", SIZE, CHUNK, 0, 8, 1 << 20)
        no_secret(b"".join(chunk for chunk, _ in pairs))

    attacked(attack, read, 3 * ITERATIONS)  # quick calls, with a narrow window each


def test_a_directory_transfer_is_scanned_and_packed_inside(attack: Attack) -> None:
    """A checkpoint directory packed for Train's restores on other nodes
    (``chunk_cache.DirectoryTransfers``): confined, then scanned and read by path."""
    r = attack.r

    def start(source: Source, config: TransferConfig) -> tuple[Any, Any]:
        # What the agent's transfer does with the source: scan it, read its files.
        found = scan(source, config.follow_symlinks)
        no_secret([e.path for e in found.entries])
        views = read_chunks(
            source, found.files, found.stamps, CHUNK, lambda _, n: memoryview(bytearray(n))
        )
        packed = b"".join(bytes(view) for _, view in views)
        no_secret(packed)
        return packed, None

    attacked(attack, lambda i: DirectoryTransfers(start).ref(r, f"{r}/d/ckpt", TransferConfig()))


# -- Train's hooks and the storage sink, with Ray --------------------------------------
