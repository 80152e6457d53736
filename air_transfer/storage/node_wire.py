"""Node storage, what its calls carry: the shapes of the values both rooms exchange
through the agent (``node_api`` declares the calls), typed here, below both and below
the durable tier that answers for what node storage no longer holds.
"""

from __future__ import annotations

from dataclasses import dataclass

from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.placed_record import PlacedRecord

#: What node storage says of a path: ``(pyarrow FileType, size, mtime_ns)``.
Info = tuple[int, int | None, int | None]
#: One entry of a listing: ``(path relative to the listed base, type, size, mtime_ns)``.
Listed = tuple[str, int, int | None, int | None]
#: What an append expects to find at commit: (device, inode, size, mtime_ns) of the
#: file it copied, () for no file; None: a plain write, which expects nothing.
Expect = tuple[int, ...] | None


@dataclass(frozen=True)
class PlacedSend:
    """A placed file's bytes to send from one of its holders to the durable tier: the
    file at ``rel`` (under the storage root and in the tier), its placement record
    ``placed`` (where its blob is, what its writer recorded) and ``record``, the
    tier's record of its bytes as the drain cut them (what each chunk sent must match)."""

    rel: str
    placed: PlacedRecord
    record: FileRecord
