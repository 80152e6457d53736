"""The manifest: what a checkpoint contains, as plain data with a schema version.

It lists every entry (directory, file, symlink) by relative POSIX path with size, mode
and mtime, and the checksum of every chunk of the files' concatenated byte stream.
Decoding *raises* on anything it cannot reproduce safely (unlike torchsnapshot's
``manifest.py``, which drops unknown kinds): the writer trusts only a validated
manifest, so no path from a manifest can reach outside the target directory.
"""

from __future__ import annotations

import dataclasses
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from air_transfer.core.checks import SCHEMA_VERSION, validate
from air_transfer.core.checksum import CHECKSUM_ALGORITHM
from air_transfer.core.entry import Entry
from air_transfer.errors import ManifestError


@dataclass(frozen=True)
class Manifest:
    """Everything needed to rebuild a checkpoint directory from its chunks.

    Files are laid end to end in ``entries`` order (directories and symlinks take no
    bytes); the stream is cut every ``chunk_bytes`` and ``chunks[i]`` is the checksum
    of chunk ``i``. Construction validates, so a Manifest object is always safe.

    ``chunks`` is None while the checksums are still being computed: an asynchronous
    transfer (``to_object_ref_async``) describes its entries before its chunks are
    packed, and its checksums arrive with the chunks (``with_checksums``).
    """

    entries: tuple[Entry, ...]
    chunk_bytes: int
    chunks: tuple[str, ...] | None
    schema_version: int = SCHEMA_VERSION
    checksum: str = CHECKSUM_ALGORITHM
    _by_path: dict[str, int] = field(init=False, repr=False, compare=False)
    _offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _total: int = field(init=False, repr=False, compare=False)
    _children: dict[str, list[int]] | None = field(
        init=False, default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        if self.chunks is not None:
            object.__setattr__(self, "chunks", tuple(self.chunks))
        by_path, offsets, total = validate(
            self.entries, self.chunk_bytes, self.chunks, self.schema_version, self.checksum
        )
        object.__setattr__(self, "_by_path", by_path)
        object.__setattr__(self, "_offsets", offsets)
        object.__setattr__(self, "_total", total)

    def __reduce__(self) -> tuple[Any, ...]:
        # Travel as the plain dict and validate again on arrival: a receiving process
        # trusts no manifest it has not checked itself.
        return (Manifest.from_dict, (self.to_dict(),))

    # -- derived views -----------------------------------------------------------
    @property
    def total_bytes(self) -> int:
        """Bytes in all files together: the length of the chunked stream."""
        return self._total

    @property
    def num_chunks(self) -> int:
        """How many ``chunk_bytes`` chunks the stream of all files is cut into."""
        return -(-self._total // self.chunk_bytes)

    @property
    def is_complete(self) -> bool:
        """Whether the chunk checksums are known (see the class docstring)."""
        return self.chunks is not None

    def with_checksums(self, chunks: Sequence[str]) -> Manifest:
        """This manifest with its chunk checksums, validated."""
        return dataclasses.replace(self, chunks=tuple(chunks))

    def chunk_length(self, index: int) -> int:
        """Bytes in chunk ``index``: ``chunk_bytes`` except for the last one."""
        return min(self.chunk_bytes, self._total - index * self.chunk_bytes)

    def files(self) -> Iterator[Entry]:
        """Regular files in stream order."""
        return (e for e in self.entries if e.kind == "file")

    def entry(self, path: str) -> Entry:
        """The entry at ``path`` (relative, POSIX); FileNotFoundError if absent."""
        norm = path.strip("/")
        index = self._by_path.get(norm)
        if index is None:
            raise FileNotFoundError(f"{path!r} is not in this checkpoint")
        return self.entries[index]

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and path.strip("/") in self._by_path

    def stream_offset(self, path: str) -> int:
        """Where the bytes of file ``path`` start in the concatenated stream."""
        entry = self.entry(path)
        if entry.kind != "file":
            raise IsADirectoryError(f"{path!r} is a {entry.kind}, not a file")
        return self._offsets[self._by_path[entry.path]]

    def children(self, directory: str) -> Iterator[Entry]:
        """Direct children of ``directory`` ("" is the checkpoint root)."""
        index = self._children
        if index is None:  # built on first use, then O(children) per call
            index = {}
            for i, e in enumerate(self.entries):
                index.setdefault(posixpath.dirname(e.path), []).append(i)
            object.__setattr__(self, "_children", index)
        entries = self.entries
        return (entries[i] for i in index.get(directory.strip("/"), ()))

    # -- (de)serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """This manifest as plain data, with its schema version (``from_dict``)."""
        return {
            "schema_version": self.schema_version,
            "checksum": self.checksum,
            "chunk_bytes": self.chunk_bytes,
            "entries": [e.to_dict() for e in self.entries],
            "chunks": None if self.chunks is None else list(self.chunks),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        """Decode and validate; any problem raises ManifestError before use."""
        if not isinstance(d, Mapping):
            raise ManifestError(f"a manifest must be a mapping, got {type(d).__name__}")
        version = d.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ManifestError(
                f"manifest schema_version {version!r} is not supported "
                f"(this air-transfer reads version {SCHEMA_VERSION}); "
                "upgrade air-transfer on the reading side"
            )
        for key in ("chunk_bytes", "entries", "chunks"):
            if key not in d:
                raise ManifestError(f"manifest lacks field {key!r}")
        entries, chunks = d["entries"], d["chunks"]
        if not isinstance(entries, Sequence) or isinstance(entries, (str, bytes)):
            raise ManifestError("manifest 'entries' must be a list")
        if chunks is not None and (
            not isinstance(chunks, Sequence) or isinstance(chunks, (str, bytes))
        ):
            raise ManifestError("manifest 'chunks' must be a list (or null while pending)")
        return cls(
            entries=tuple(Entry.from_dict(e) for e in entries),
            chunk_bytes=d["chunk_bytes"],
            chunks=None if chunks is None else tuple(chunks),
            schema_version=version,
            checksum=d.get("checksum", CHECKSUM_ALGORITHM),
        )
