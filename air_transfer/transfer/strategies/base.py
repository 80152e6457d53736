"""The interface every transfer strategy implements (torchsnapshot's ``StoragePlugin``
is the model: one small abstract class, one module per implementation)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from air_transfer.config import TransferConfig
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.core.scan import Source, Stamp


@dataclass(frozen=True)
class Packed:
    """What packing produced: the payload (anything picklable that lets
    ``iter_chunks`` produce the chunks again, typically ObjectRefs) and the checksum
    of every chunk, in order: each a str, or, from ``submit``, an ObjectRef that
    resolves to it once the chunk is packed (and raises what packing raised)."""

    payload: Any
    checksums: tuple[Any, ...]

    @property
    def pending(self) -> bool:
        """Whether the checksums are still refs (packing may still be running)."""
        return any(not isinstance(c, str) for c in self.checksums)


class TransferStrategy(ABC):
    """Carries a checkpoint's chunk stream from the packing process to readers.

    Subclasses set ``name`` and are registered with ``register_strategy``. Instances
    are stateless and picklable: a transfer handle stores the instance so a reading
    process needs no registration of its own.
    """

    name: ClassVar[str]

    @abstractmethod
    def pack(
        self,
        source: Source,
        files: Sequence[Entry],
        stamps: Sequence[Stamp],
        config: TransferConfig,
    ) -> Packed:
        """Read ``files`` (stream order) from ``source``, cut into
        ``config.chunk_bytes`` chunks, and store them somewhere readers can reach.

        ``stamps`` are the files as scanned: read with ``proven_read.read_chunks`` (or
        ``fill_chunk``), which raises SourceChangedError for a file that no longer
        matches its stamp, so the checksums are of the version the scan described."""

    def submit(
        self,
        source: Source,
        files: Sequence[Entry],
        stamps: Sequence[Stamp],
        config: TransferConfig,
    ) -> Packed:
        """Start packing and return at once: a payload whose chunks readers may
        already ask for (they wait for a chunk not yet packed), and checksums that are
        ObjectRefs resolving as chunks are packed. ``to_object_ref_async`` uses this;
        the default packs here, blocking, with ``pack``."""
        return self.pack(source, files, stamps, config)

    @abstractmethod
    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Iterator[Any]:
        """Yield chunks ``start`` to ``stop - 1`` in order as buffers (numpy arrays,
        bytes, memoryviews), with at most ``config.window`` fetched ahead.

        The caller verifies checksums; a strategy only has to deliver bytes.
        """

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
