"""The interface every transfer strategy implements (torchsnapshot's ``StoragePlugin``
is the model: one small abstract class, one module per implementation).

A strategy says what a transfer's payload is (its ``layout``), how a reader gets
the chunks back from it (``iter_chunks``) and which ObjectRefs it holds (``refs``);
``pack`` is its own way of packing, in the calling process. Where and by whom the
chunks are packed (here, in the node agent's tasks, shared with a blocking caller,
reusing live chunks) is the packers' business (``transfer.packers``), chosen from
the layout.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import ray

from air_transfer.cluster.refs import PendingChecksum, StatusRef
from air_transfer.config import TransferConfig
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.core.plan import ChunkPlan, plan_chunks
from air_transfer.core.readahead import read_chunks_ahead
from air_transfer.core.scan import Source, Stamp

if TYPE_CHECKING:
    from typing_extensions import Buffer  # collections.abc.Buffer from Python 3.12

#: What ``iter_chunks`` yields: a checkpoint's chunks in order, as buffers.
Chunks: TypeAlias = "Iterator[Buffer]"


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
    of every chunk, in order: each a str, or, from a packer that returns before
    packing is done (``transfer.packers``), an ObjectRef that resolves to it once
    the chunk is packed (and raises what packing raised)."""

    payload: Any
    checksums: tuple[PendingChecksum, ...]
    #: Refs that resolve once every chunk is stored (the source no longer needed),
    #: where that is before every checksum is known; None: the checksums.
    stored: tuple[StatusRef, ...] | None = None

    @property
    def pending(self) -> bool:
        """Whether the checksums are still refs (packing may still be running)."""
        return any(not isinstance(c, str) for c in self.checksums)


class Layout(Enum):
    """What a payload is, which decides who may pack it (``transfer.packers``)."""

    #: The strategy's own: only its ``pack`` makes one, in the calling process.
    CUSTOM = "custom"
    #: One object per chunk (numpy uint8 arrays): the payload is their refs, in order.
    CHUNKS = "chunks"
    #: One object holding the whole stream (a numpy uint8 array): the payload is its ref.
    OBJECT = "object"
    #: No object: the source node's agent reads the chunks when a reader asks; the
    #: payload is a ``streamed.StreamSource``.
    STREAMED = "streamed"


class TransferStrategy(ABC):
    """Carries a checkpoint's chunk stream from the packing process to readers.

    Subclasses set ``name`` and are registered with ``register_strategy``. Instances
    are stateless and picklable: a transfer handle stores the instance so a reading
    process needs no registration of its own.
    """

    name: ClassVar[str]
    #: What the payload is. A built-in layout lets this node's agent pack it (out of
    #: the caller's Python, returning at once); ``CUSTOM``: only ``pack`` makes it.
    layout: ClassVar[Layout] = Layout.CUSTOM
    #: Whether the buffers ``iter_chunks`` yields stay unchanged while referenced
    #: (object-store chunks, fresh ``bytes``): the reader then writes a large file's
    #: bytes from them in place while it moves on to the next chunk. Leave it False
    #: for a strategy that refills one buffer: each write then ends before the next
    #: chunk is asked for.
    chunks_kept: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Refuse a strategy written for the former interface: its ``submit`` or
        ``submit_blocking`` would never be called (where a strategy is packed is
        now chosen from its ``layout``), which would change what it does unseen."""
        super().__init_subclass__(**kwargs)
        gone = sorted({"submit", "submit_blocking"} & set(vars(cls)))
        if gone:
            raise TypeError(
                f"{cls.__qualname__} defines {', '.join(gone)}, which TransferStrategy "
                "no longer calls: a custom strategy packs in pack() (run on the "
                "caller's background thread) and says what its payload is by its "
                "layout; move that code into pack()"
            )

    @abstractmethod
    def pack(self, request: PackRequest) -> Packed:
        """Cut ``request``'s files into ``request.chunk_bytes`` chunks and store them
        somewhere readers can reach, in this process. ``request.chunks()`` hands over
        each chunk filled, proven and checksummed. A ``CUSTOM`` strategy is always
        packed so (for ``to_object_ref_async``, on the caller's background thread); a
        built-in layout only when the agent cannot read the source."""

    def check(self, source: Source, total_bytes: int, config: TransferConfig) -> None:
        """Raise if this strategy cannot pack ``total_bytes`` of files from ``source``
        under ``config`` (a clear error naming the limit). Runs on the caller's
        thread for a strategy named in the config, and before the agent packs a
        built-in layout; the default accepts everything."""
        return None

    def refs(self, payload: Any) -> list[ray.ObjectRef[Any]]:
        """The ObjectRefs ``payload`` holds (an agent that packs for another process
        keeps the transfer while that process references any: ``cluster.transfer_leases``).
        The default reads a list or tuple of refs, one per chunk, as a ``pack`` that
        puts each chunk makes; override it for any other payload."""
        if not isinstance(payload, (list, tuple)):
            return []
        return [item for item in payload if isinstance(item, ray.ObjectRef)]

    @abstractmethod
    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Chunks:
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
