"""Node storage with ``placement="writer"``, as its parts see it: what a placed
write (``placed_upload``), a repair of holders (``placed_repair``) and the sweep of
orphan blobs (``placed_sweep``) ask of the storage they work for, declared once
(``writer_placed.WriterPlacedHandler`` is the one class that has it all), so that
those modules need not import the handler that imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from air_transfer.config import TransferConfig
    from air_transfer.storage.client.replica_write import ReplicaWrite
    from air_transfer.storage.client.streams import AgentLink
    from air_transfer.storage.client.upload_copies import Staged
    from air_transfer.storage.placed_record import Holder, PlacedRecord


class PlacedStorage(Protocol):
    """A writer-placed storage: its root, its K, where its holders keep bytes, and
    the calls its parts make."""

    root: str
    replicas: int
    replica_root: str

    @property
    def key(self) -> str: ...

    @property
    def config(self) -> TransferConfig: ...

    def ensure(self) -> Any:
        """The replica registry's view of the storage, registering it on first use."""
        ...

    def rel(self, path: str) -> str:
        """``path`` relative to the root (as each copy names it)."""
        ...

    def domains(self) -> dict[str, str]:
        """Each live node's failure domain (``core.spread``)."""
        ...

    def placed_link(self, node: str, root: str) -> AgentLink:
        """The link to ``node``'s agent for its placed root ``root``."""
        ...

    def record_of(self, path: str) -> PlacedRecord | None:
        """Where ``path``'s bytes are, if it is placed."""
        ...

    def placed_under(self, path: str) -> list[tuple[str, PlacedRecord, float]]:
        """``(path, record, stub mtime)`` of every placed file at or under ``path``."""
        ...

    def stage_holders(self, blob: str) -> tuple[list[Holder], list[Staged]]:
        """A staging file for ``blob`` on each of the file's holders."""
        ...

    def stage_copies(self, path: str, append: bool) -> tuple[list[Staged], ReplicaWrite]:
        """A staging file for ``path`` on the storage node and its copies."""
        ...

    def open_inline(self, path: str) -> pa.NativeFile:
        """``path`` written whole to the storage node and its copies."""
        ...

    def change(self, paths: list[str], method: Callable[[AgentLink, str, str], Any]) -> None:
        """``method(link, root, op)`` on every copy, as one change of ``paths``."""
        ...

    def delete_record(self, record: PlacedRecord) -> None:
        """Delete the bytes ``record`` names."""
        ...

    def delete_blobs(self, holders: list[Holder], wheres: list[str]) -> None:
        """Delete blob ``wheres[i]`` on ``holders[i]`` (and its checksums)."""
        ...

    def end_pending(self, holders: list[Holder], blob: str) -> None:
        """Remove ``blob``'s pending markers from ``holders``."""
        ...
