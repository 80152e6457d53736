"""Node storage with ``placement="writer"``: a placed file's bytes checked against
what its writer recorded, on every holder that serves or gives them.

The writer hashes each chunk as it writes (``placed_record.ChunkSummer``) and
commits the list (``PlacedSums``) beside the blob on every holder (``write_sums``)
before the stub that names them is published; the stub's record pins the list by
its sha256. A reader takes the list from the first holder whose copy matches the
record (``load_sums``) and checks every chunk against it wherever it read it (this
node's disk: ``local_chunks``; another holder's agent); a check of a holder
(``holder_problem``: ``repair_holders``, ``air-transfer verify``) asks the holder's
agent for the checksum of each of its chunks, which never leave that node.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Protocol

import pyarrow.fs as pafs

from air_transfer.cluster.liveness import this_process
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.confine import open_regular
from air_transfer.errors import ChecksumError
from air_transfer.storage.client.streams import AgentLink, _chunks
from air_transfer.storage.node_api import ChunkAt, Commit, NodeFiles, NodeMetadata, NodeReads
from air_transfer.storage.placed_record import (
    Holder,
    PlacedRecord,
    PlacedSums,
    decode_sums,
)

if TYPE_CHECKING:
    from air_transfer.config import TransferConfig

#: Chunks whose checksums one call asks of a holder's agent.
_BATCH = 8


class HolderLinks(Protocol):
    """What a check of holders asks of its storage (``writer_placed``'s handler)."""

    @property
    def config(self) -> TransferConfig: ...

    def placed_link(self, node: str, root: str) -> AgentLink: ...


class Links:
    """``HolderLinks`` of a process that has no writer-placed storage open (a
    command): one ``AgentLink`` per holder, made as first asked for."""

    def __init__(self, config: TransferConfig) -> None:
        self.config = config
        self._links: dict[Holder, AgentLink] = {}

    def placed_link(self, node: str, root: str) -> AgentLink:
        link = self._links.get((node, root))
        if link is None:
            link = self._links[(node, root)] = AgentLink(node, root, self.config)
        return link


def write_sums(
    links: HolderLinks, record: PlacedRecord, sums: PlacedSums, holders: Sequence[Holder] = ()
) -> None:
    """Commit ``sums`` beside the blob on ``holders`` (default: every holder of
    ``record``); an error: the first holder's that failed (the caller deletes what
    the others hold)."""
    data = sums.encode()
    for holder in holders or record.holders:
        link, where = links.placed_link(*holder), record.sums_where(holder)
        staging, _, _ = link.call(NodeFiles.fs_open_write, link.root, where, False, this_process())
        try:
            link.call(
                NodeFiles.fs_write, link.root, ChunkAt(staging, 0), data, chunk_checksum(data)
            )
            done = Commit(where, staging, len(data), b"", chunk_checksum(b""), len(data))
            link.call(NodeFiles.fs_commit, link.root, done)
        except BaseException:
            link.call(NodeFiles.fs_abort, link.root, staging)
            raise


def fetch_sums(links: HolderLinks, path: str, record: PlacedRecord, holder: Holder) -> PlacedSums:
    """The checksums of placed file ``path`` as ``holder`` keeps them, checked against
    ``record`` (ValueError: they do not match it; OSError: they cannot be read)."""
    link, where = links.placed_link(*holder), record.sums_where(holder)
    [(kind, size, _)] = link.call(NodeMetadata.fs_info, link.root, [where])
    if kind != pafs.FileType.File or size is None:
        raise FileNotFoundError(errno.ENOENT, "the checksums of a placed file are missing", where)
    data = b"".join(bytes(view) for _, view in _chunks(link, where, size, 0, 0, max(1, size)))
    return decode_sums(data, record, path, where)


def holder_problem(
    links: HolderLinks, path: str, record: PlacedRecord, holder: Holder
) -> str | None:
    """What is wrong with ``holder``'s copy of placed file ``path`` (None: its
    checksums and every byte of its blob match ``record``): checked by the holder's
    agent, no byte of the blob leaving its node."""
    link, where = links.placed_link(*holder), record.where(holder)
    try:
        sums = fetch_sums(links, path, record, holder)
        [(kind, size, _)] = link.call(NodeMetadata.fs_info, link.root, [where])
        if kind != pafs.FileType.File:
            return f"its blob {where!r} is missing"
        if size != record.size:
            return f"its blob {where!r} holds {size} bytes, the record {record.size}"
        got = _holder_checksums(link, where, record.size, sums.chunk_bytes)
    except (OSError, ValueError) as e:
        return f"{type(e).__name__}: {e}"
    bad = [i for i, (a, b) in enumerate(zip(got, sums.sums, strict=True)) if a != b]
    if bad:
        return (
            f"{len(bad)} chunk(s) of its blob {where!r} (the first: chunk {bad[0]} of "
            f"{sums.chunk_bytes} bytes) do not match the record"
        )
    return None


def _holder_checksums(link: AgentLink, where: str, size: int, chunk_bytes: int) -> list[str]:
    """The checksum of each chunk of the blob at ``where``, computed by its agent."""
    count, out = -(-size // chunk_bytes), []
    for first in range(0, count, _BATCH):
        n = min(_BATCH, count - first)
        [pairs] = link.call(NodeReads.file_chunks, link.root, where, size, chunk_bytes, first, n, 0)
        for _, ref in pairs:
            checksum = link.wait(ref)
            if isinstance(checksum, BaseException):  # packing failed: it changed meanwhile
                raise checksum
            out.append(checksum)
    return out


def local_chunks(
    root: str, where: str, size: int, chunk_bytes: int, first: int
) -> Iterator[tuple[int, memoryview]]:
    """Chunks ``first``.. of the blob at ``where`` on this node's disk (confined to
    its placed root ``root``); ChecksumError if it does not hold ``size`` bytes."""
    fd, st = open_regular(root, where)
    try:
        if st.st_size != size:
            raise ChecksumError(
                errno.EIO, f"holds {st.st_size} bytes, its record says {size}", where
            )
        for index in range(first, -(-size // chunk_bytes)):
            want = min(chunk_bytes, size - index * chunk_bytes)
            data = os.pread(fd, want, index * chunk_bytes)
            if len(data) != want:
                raise ChecksumError(errno.EIO, f"ends within chunk {index}", where)
            yield index, memoryview(data)
    finally:
        os.close(fd)


def not_matching(path: str, record: PlacedRecord, tried: list[str]) -> ChecksumError:
    """The error of a read of placed file ``path`` that no holder could serve with
    bytes matching its record (``tried``: what each holder did)."""
    return ChecksumError(
        errno.EIO,
        f"no holder of {path!r} has bytes that match its record (storage "
        f"placement='writer'; holders {', '.join(n[:12] for n, _ in record.holders)}: "
        f"{'; '.join(tried)}): nothing of it was returned that did not match",
        path,
    )
