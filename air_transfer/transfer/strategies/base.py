"""The interface every transfer strategy implements (torchsnapshot's ``StoragePlugin``
is the model: one small abstract class, one module per implementation)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from air_transfer.config import TransferConfig
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.core.plan import ChunkPlan, plan_chunks
from air_transfer.core.readahead import read_chunks_ahead
from air_transfer.core.scan import Source, Stamp


@dataclass(frozen=True)
class PackRequest:
    """What a strategy is asked to pack: the regular files of ``source`` in stream
    order, with the stamp the scan took of each (every read is proven against it),
    and the transfer's config. Picklable, so packing may happen in another process."""

    source: Source
    files: tuple[Entry, ...]
    stamps: tuple[Stamp, ...]
    config: TransferConfig

    @property
    def total_bytes(self) -> int:
        """Bytes in all the request's files together."""
        return sum(f.size for f in self.files)

    @property
    def chunk_bytes(self) -> int:
        """The size of every chunk but the last (``config.chunk_bytes``)."""
        return self.config.chunk_bytes

    def chunks(self) -> Iterator[tuple[int, memoryview, str]]:
        """Every chunk in order as ``(index, view, checksum)``, read and hashed one
        chunk ahead in a background thread. The bytes are proven to be the scanned
        version (SourceChangedError names a file that changed), so the checksum is of
        what readers must get back. A view is valid until the next chunk is asked
        for: store or copy it first."""
        return read_chunks_ahead(self.source, self.files, self.stamps, self.chunk_bytes)

    def plans(self) -> Iterator[ChunkPlan]:
        """Which spans of which files each chunk carries (to fill chunks elsewhere)."""
        return plan_chunks(self.files, self.stamps, self.chunk_bytes)


@dataclass(frozen=True)
class Packed:
    """What packing produced: the payload (anything picklable that lets
    ``iter_chunks`` produce the chunks again, typically ObjectRefs) and the checksum
    of every chunk, in order: each a str, or, from ``submit``, an ObjectRef that
    resolves to it once the chunk is packed (and raises what packing raised)."""

    payload: Any
    checksums: tuple[Any, ...]
    #: Refs that resolve once every chunk is stored (the source no longer needed),
    #: where that is before every checksum is known; None: the checksums.
    stored: tuple[Any, ...] | None = None

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
    #: Whether the buffers ``iter_chunks`` yields stay unchanged while referenced
    #: (object-store chunks, fresh ``bytes``): the reader then writes a large file's
    #: bytes from them in place while it moves on to the next chunk. Leave it False
    #: for a strategy that refills one buffer: each write then ends before the next
    #: chunk is asked for.
    chunks_kept: ClassVar[bool] = False

    @abstractmethod
    def pack(self, request: PackRequest) -> Packed:
        """Cut ``request``'s files into ``request.chunk_bytes`` chunks and store them
        somewhere readers can reach. ``request.chunks()`` hands over each chunk
        filled, proven and checksummed."""

    def check(self, source: Source, total_bytes: int, config: TransferConfig) -> None:
        """Raise if this strategy cannot pack ``total_bytes`` of files from ``source``
        under ``config`` (a clear error naming the limit). Runs on the caller's
        thread before ``submit``, which ``to_object_ref_async`` runs on a background
        thread; the default accepts everything."""
        return None

    def submit(self, request: PackRequest) -> Packed:
        """Start packing and return at once: a payload whose chunks readers may
        already ask for (they wait for a chunk not yet packed), and checksums that are
        ObjectRefs resolving as chunks are packed. ``to_object_ref_async`` uses this;
        the default packs here, blocking, with ``pack``."""
        return self.pack(request)

    def submit_blocking(self, request: PackRequest) -> Packed:
        """Like ``submit``, for a caller that waits until every chunk is packed
        (``to_object_ref``): packing may use the caller's process too. The default
        is ``submit``."""
        return self.submit(request)

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
