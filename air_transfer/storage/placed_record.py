"""Node storage with ``placement="writer"``, the wire of it: where a large file's
bytes live (``PlacedRecord``, kept in the first bytes of a sparse stub of the file's
size on the storage node and its copies), which nodes hold them (``choose_holders``:
the writer's own first, then the next live nodes in turn), and where on a holder
(``placed_root``, ``blob_path``), and what pins its bytes (``PlacedSums``: each
chunk's checksum, kept beside the blob on every holder, its sha256 in the record).

The stub has the file's size, so listings and infos answer as for any file, with no
call of their own; its record is read only by a reader of the file (``decode``) and
by a delete or overwrite, whose holders' bytes go with it. What makes a file a stub
is a mark the storage node sets when the stub is committed, never its bytes
(``core.placed_mark``): a file that merely begins like a record is its own bytes.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from air_transfer.core.checksum import chunk_hasher, is_checksum

if TYPE_CHECKING:
    from collections.abc import Buffer

from air_transfer.core.spread import spread

#: Files smaller than this stay whole on the storage node and its copies (Ray
#: Train's run state, markers, torch DCP's ``.metadata``): only larger ones are placed.
PLACE_MIN_BYTES = 1024 * 1024
#: The most a stub's record takes (its head, read as one chunk of this size).
RECORD_BYTES = 16 * 1024
_MAGIC = b"AIR-TRANSFER-PLACED\x00v1\n"
_BLOB = re.compile(r"[0-9a-f]{24}/[0-9a-f]{32}")
_NODE = re.compile(r"[0-9a-f]{16,128}")  # a Ray node id, in hex
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SUMS_MAGIC = b"AIR-TRANSFER-PLACED-SUMS\x00v1\n"
#: The name a blob's checksums (``PlacedSums``) have beside it on each holder.
SUMS_SUFFIX = ".sums"

#: A holder of a file's bytes: (node id, its placed root on that node).
Holder = tuple[str, str]


@dataclass(frozen=True)
class PlacedRecord:
    """A placed file: ``size`` bytes, stored as ``blob`` (a path under each holder's
    placed root) on every one of ``holders`` before the record was published, with
    its ``PlacedSums`` beside it, whose encoding's sha256 is ``sums`` (hex): what
    every read and repair checks a holder's bytes against."""

    size: int
    blob: str
    holders: tuple[Holder, ...]
    sums: str

    def encode(self) -> bytes:
        holders = [list(h) for h in self.holders]
        body = {"size": self.size, "blob": self.blob, "holders": holders, "sums": self.sums}
        data = _MAGIC + json.dumps(body, separators=(",", ":")).encode() + b"\n"
        if len(data) > RECORD_BYTES or len(data) >= self.size:
            raise ValueError(
                f"a placement record of {len(data)} bytes does not fit the stub of a "
                f"{self.size}-byte file (at most {RECORD_BYTES} bytes)"
            )
        return data

    def where(self, holder: Holder) -> str:
        """The blob's path on ``holder``."""
        return posixpath.join(holder[1], self.blob)

    def sums_where(self, holder: Holder) -> str:
        """The path of the blob's ``PlacedSums`` on ``holder``."""
        return self.where(holder) + SUMS_SUFFIX


@dataclass(frozen=True)
class PlacedSums:
    """What the writer of a placed file wrote: ``chunk_checksum`` of each of its
    chunks of ``chunk_bytes`` (the last may be shorter), ``size`` bytes in all. Kept
    beside the blob on every holder (a 100 GB file's sums do not fit a record);
    the record pins it by its encoding's sha256 (``digest``)."""

    size: int
    chunk_bytes: int
    sums: tuple[str, ...]

    def encode(self) -> bytes:
        body = {"size": self.size, "chunk_bytes": self.chunk_bytes, "sums": list(self.sums)}
        return _SUMS_MAGIC + json.dumps(body, separators=(",", ":")).encode() + b"\n"

    def digest(self) -> str:
        return hashlib.sha256(self.encode()).hexdigest()


class ChunkSummer:
    """The ``PlacedSums`` of bytes written in order (``update``), each chunk of
    ``chunk_bytes`` hashed as its bytes pass (``finish``: the sums of all)."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes, self.size = chunk_bytes, 0
        self._sums: list[str] = []
        self._hasher = chunk_hasher()

    def update(self, data: Buffer) -> None:
        view = memoryview(data).cast("B")
        while view:
            room = self.chunk_bytes - self.size % self.chunk_bytes
            piece, view = view[:room], view[room:]
            self._hasher.update(piece)
            self.size += len(piece)
            if self.size % self.chunk_bytes == 0:
                self._sums.append(self._hasher.hexdigest())
                self._hasher = chunk_hasher()

    def finish(self) -> PlacedSums:
        last = [self._hasher.hexdigest()] if self.size % self.chunk_bytes else []
        return PlacedSums(self.size, self.chunk_bytes, (*self._sums, *last))


def decode_sums(data: bytes, record: PlacedRecord, path: str, where: str) -> PlacedSums:
    """The ``PlacedSums`` of placed file ``path`` read from ``where`` (a holder's),
    checked: its sha256 the record's, and it describes the record's file. ValueError
    naming both for any other (damaged, forged, another file's)."""
    try:
        if hashlib.sha256(data).hexdigest() != record.sums:
            raise ValueError("its sha256 is not the one its record holds")
        line, newline, rest = data.removeprefix(_SUMS_MAGIC).partition(b"\n")
        if not data.startswith(_SUMS_MAGIC) or not newline or rest:
            raise ValueError("no checksum list")
        body = json.loads(line)
        sums = PlacedSums(int(body["size"]), int(body["chunk_bytes"]), tuple(body["sums"]))
        count = -(-sums.size // sums.chunk_bytes) if sums.chunk_bytes > 0 else -1
        if sums.size != record.size or len(sums.sums) != count:
            raise ValueError(f"it describes {sums.size} bytes, the file has {record.size}")
        if not all(is_checksum(s) for s in sums.sums):
            raise ValueError("a checksum is not one")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"the checksums of placed file {path!r} at {where!r} do not match its record "
            f"(storage placement='writer'; {type(e).__name__}: {e}): refused"
        ) from e
    return sums


def decode(head: bytes | memoryview, size: int, path: str, replica_root: str) -> PlacedRecord:
    """The record of the stub ``path`` of ``size`` bytes (marked a stub by the storage
    node, never by its bytes: ``core.placed_mark``), checked: its own size, a blob
    name as ``blob_path`` makes (it cannot leave a placed root), holders that are node
    ids each at its placed root under ``replica_root``. ValueError naming ``path``
    for any other."""
    data = bytes(head[:RECORD_BYTES])
    line, newline, _ = data.removeprefix(_MAGIC).partition(b"\n")
    try:
        if not data.startswith(_MAGIC) or not newline:
            raise ValueError("no record")
        body = json.loads(line)
        record = PlacedRecord(
            int(body["size"]),
            str(body["blob"]),
            tuple((str(n), str(r)) for n, r in body["holders"]),
            str(body["sums"]),
        )
        _check(record, size, replica_root)
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"the placement record of {path!r} (storage placement='writer') is not "
            f"valid ({type(e).__name__}: {e}); its bytes cannot be found: refused"
        ) from e
    return record


def _check(record: PlacedRecord, size: int, replica_root: str) -> None:
    if record.size != size:
        raise ValueError(f"it says {record.size} bytes, the file has {size}")
    if not _BLOB.fullmatch(record.blob):
        raise ValueError(f"blob {record.blob!r} is not a blob name")
    if not _SHA256.fullmatch(record.sums):
        raise ValueError(f"sums {record.sums!r} is not a sha256 of the blob's checksums")
    if not record.holders or len({n for n, _ in record.holders}) != len(record.holders):
        raise ValueError("no holders, or one named twice")
    for node, root in record.holders:
        if not _NODE.fullmatch(node):
            raise ValueError(f"holder {node!r} is not a node id")
        if root != placed_root(replica_root, node):
            raise ValueError(f"holder {node[:12]}'s root {root!r} is not its placed root")


def placed_root(replica_root: str, node: str) -> str:
    """Where node ``node`` keeps the bytes it holds: ``replica_root`` formatted with
    ``<node id>.placed`` (beside that node's copy, never inside a copy's tree, which
    repair empties)."""
    return posixpath.normpath(replica_root.format(node_id=f"{node}.placed"))


def blob_path(key: str) -> str:
    """A new blob's path under a placed root: one directory per storage (``key``),
    a name no other write uses (so racing writers of a path never share a blob)."""
    return f"{blob_dir(key)}/{uuid.uuid4().hex}"


def blob_dir(key: str) -> str:
    """The directory under each placed root that holds storage ``key``'s blobs."""
    return hashlib.sha256(key.encode()).hexdigest()[:24]


def choose_holders(
    writer: str, live: list[str], replicas: int, domains: Mapping[str, str]
) -> list[str]:
    """The ``replicas`` nodes to hold a file ``writer`` wrote: ``writer`` first (its
    bytes do not leave its node), then the live nodes after it on the ring of
    failure ``domains`` (``core.spread``): every domain before a second copy in one,
    and when every node writes one file, each receives one, none more. ValueError
    when fewer than ``replicas`` nodes live."""
    if len(set(live) | {writer}) < replicas:
        raise ValueError(
            f"placement='writer' with replicas={replicas} needs {replicas} live nodes to "
            f"hold a file; {len(set(live) | {writer})} live"
        )
    return spread([writer], live, replicas, domains)
