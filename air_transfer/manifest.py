"""The manifest: what a checkpoint contains, as plain data with a schema version.

It lists every entry (directory, file, symlink) by relative POSIX path with size, mode
and mtime, and the checksum of every chunk of the files' concatenated byte stream.
Decoding *raises* on anything it cannot reproduce safely (unlike torchsnapshot's
``manifest.py``, which drops unknown kinds): the writer trusts only a validated
manifest, so no path from a manifest can reach outside the target directory.
"""

from __future__ import annotations

import posixpath
import stat
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import xxhash

from air_transfer.errors import ManifestError

SCHEMA_VERSION = 1
CHECKSUM_ALGORITHM = "xxh3_128"
_CHECKSUM_HEX_LEN = 32

EntryKind = Literal["dir", "file", "symlink"]
_KINDS = ("dir", "file", "symlink")


def chunk_checksum(data: Any) -> str:
    """xxh3-128 of a chunk (any buffer), as hex. ~20 GB/s per core, so verification
    costs far less than the copy it protects (zlib.crc32 manages ~4 GB/s)."""
    return xxhash.xxh3_128_hexdigest(data)


@dataclass(frozen=True)
class Entry:
    """One directory, regular file or symlink of the checkpoint.

    ``path`` is relative and POSIX (``sub/model.bin``); ``size`` is the byte count of
    a file (0 otherwise); ``mode`` the permission bits; ``target`` a symlink's text.
    """

    path: str
    kind: EntryKind
    size: int = 0
    mode: int = 0o644
    mtime_ns: int = 0
    target: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path,
            "kind": self.kind,
            "size": self.size,
            "mode": self.mode,
            "mtime_ns": self.mtime_ns,
        }
        if self.target is not None:
            d["target"] = self.target
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        if not isinstance(d, Mapping):
            raise ManifestError(f"manifest entry must be a mapping, got {d!r}")
        unknown = set(d) - {"path", "kind", "size", "mode", "mtime_ns", "target"}
        if unknown:
            raise ManifestError(
                f"manifest entry {d.get('path')!r} has unknown fields {sorted(unknown)}"
            )
        try:
            return cls(
                path=d["path"],
                kind=d["kind"],
                size=d.get("size", 0),
                mode=d.get("mode", 0o644),
                mtime_ns=d.get("mtime_ns", 0),
                target=d.get("target"),
            )
        except KeyError as e:
            raise ManifestError(f"manifest entry {dict(d)!r} lacks field {e}") from e


@dataclass(frozen=True)
class Manifest:
    """Everything needed to rebuild a checkpoint directory from its chunks.

    Files are laid end to end in ``entries`` order (directories and symlinks take no
    bytes); the stream is cut every ``chunk_bytes`` and ``chunks[i]`` is the checksum
    of chunk ``i``. Construction validates, so a Manifest object is always safe.
    """

    entries: tuple[Entry, ...]
    chunk_bytes: int
    chunks: tuple[str, ...]
    schema_version: int = SCHEMA_VERSION
    checksum: str = CHECKSUM_ALGORITHM
    _by_path: dict[str, int] = field(init=False, repr=False, compare=False)
    _offsets: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _total: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", tuple(self.entries))
        object.__setattr__(self, "chunks", tuple(self.chunks))
        by_path, offsets, total = _validate(self)
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
        return len(self.chunks)

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
        directory = directory.strip("/")
        return (e for e in self.entries if posixpath.dirname(e.path) == directory)

    # -- (de)serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "checksum": self.checksum,
            "chunk_bytes": self.chunk_bytes,
            "entries": [e.to_dict() for e in self.entries],
            "chunks": list(self.chunks),
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
        if not isinstance(chunks, Sequence) or isinstance(chunks, (str, bytes)):
            raise ManifestError("manifest 'chunks' must be a list")
        return cls(
            entries=tuple(Entry.from_dict(e) for e in entries),
            chunk_bytes=d["chunk_bytes"],
            chunks=tuple(chunks),
            schema_version=version,
            checksum=d.get("checksum", CHECKSUM_ALGORITHM),
        )


def check_relative_path(path: object) -> str:
    """Return ``path`` if it is a safe relative POSIX path, else raise ManifestError.

    Safe means: a non-empty str, not absolute, no NUL, no empty, ``.`` or ``..``
    segment. Such a path joined under any directory stays under it.
    """
    if not isinstance(path, str) or not path:
        raise ManifestError(f"manifest path {path!r} must be a non-empty string")
    if "\x00" in path:
        raise ManifestError(f"manifest path {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise ManifestError(f"manifest path {path!r} is absolute")
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise ManifestError(
                f"manifest path {path!r} has a {part or 'empty'!r} segment; "
                "only plain relative paths are allowed"
            )
    return path


def _check_int(name: str, value: object, path: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ManifestError(f"manifest {name} of {path!r} must be an int >= {low}, got {value!r}")
    return value


def _validate(m: Manifest) -> tuple[dict[str, int], tuple[int, ...], int]:
    if m.schema_version != SCHEMA_VERSION:
        raise ManifestError(f"manifest schema_version {m.schema_version!r} unsupported")
    if m.checksum != CHECKSUM_ALGORITHM:
        raise ManifestError(
            f"manifest checksum algorithm {m.checksum!r} unsupported "
            f"(expected {CHECKSUM_ALGORITHM!r})"
        )
    _check_int("chunk_bytes", m.chunk_bytes, "<manifest>", low=1)

    by_path: dict[str, int] = {}
    offsets: list[int] = []
    offset = 0
    for index, e in enumerate(m.entries):
        if not isinstance(e, Entry):
            raise ManifestError(f"manifest entry {e!r} is not an Entry")
        path = check_relative_path(e.path)
        if path in by_path:
            raise ManifestError(f"manifest lists {path!r} twice")
        if e.kind not in _KINDS:
            raise ManifestError(
                f"manifest entry {path!r} has unknown kind {e.kind!r} (known: {', '.join(_KINDS)})"
            )
        _check_int("size", e.size, path)
        _check_int("mtime_ns", e.mtime_ns, path)
        mode = _check_int("mode", e.mode, path)
        if mode != stat.S_IMODE(mode):
            raise ManifestError(f"manifest mode {mode:o} of {path!r} has non-permission bits")
        if e.kind != "file" and e.size != 0:
            raise ManifestError(f"manifest {e.kind} {path!r} has size {e.size}, must be 0")
        if e.kind != "symlink" and e.target is not None:
            raise ManifestError(f"manifest {e.kind} {path!r} has a link target")
        by_path[path] = index
        offsets.append(offset)
        if e.kind == "file":
            offset += e.size

    # Every parent must be a directory entry of the manifest: writing "a/b" where "a"
    # is a symlink would follow the link, possibly out of the target.
    for e in m.entries:
        parent = posixpath.dirname(e.path)
        if parent and (parent not in by_path or m.entries[by_path[parent]].kind != "dir"):
            raise ManifestError(
                f"manifest entry {e.path!r} has parent {parent!r} that is not a "
                "directory entry of the manifest"
            )
    for e in m.entries:
        if e.kind == "symlink":
            _check_link_target(e, m.entries, by_path)

    total = offset
    for i, c in enumerate(m.chunks):
        if not isinstance(c, str) or len(c) != _CHECKSUM_HEX_LEN:
            raise ManifestError(f"manifest checksum of chunk {i} is malformed: {c!r}")
    expected = -(-total // m.chunk_bytes)
    if len(m.chunks) != expected:
        raise ManifestError(
            f"manifest sizes are inconsistent: {total} bytes of files in chunks of "
            f"{m.chunk_bytes} make {expected} chunks, but {len(m.chunks)} checksums "
            "are listed"
        )
    return by_path, tuple(offsets), total


def _check_link_target(link: Entry, entries: Sequence[Entry], by_path: Mapping[str, int]) -> None:
    """Refuse a symlink whose target, resolved through the manifest's own symlinks,
    leaves the checkpoint. A lexical ``normpath`` is not enough: with ``d/l -> ..``,
    ``x -> d/l/..`` normalises to ``d`` but really resolves to the root's parent."""
    target = link.target
    if not isinstance(target, str) or not target or "\x00" in target:
        raise ManifestError(f"manifest symlink {link.path!r} has invalid target {target!r}")
    if target.startswith("/"):
        raise ManifestError(f"manifest symlink {link.path!r} -> {target!r} is absolute")

    def resolve(parts: list[str], text: str, depth: int) -> list[str]:
        if depth > 40:
            raise ManifestError(f"manifest symlink {link.path!r} is part of a link loop")
        for comp in text.split("/"):
            if comp in ("", "."):
                continue
            if comp == "..":
                if not parts:
                    raise ManifestError(
                        f"manifest symlink {link.path!r} -> {target!r} points outside "
                        "the checkpoint"
                    )
                parts = parts[:-1]
                continue
            parts = [*parts, comp]
            index = by_path.get("/".join(parts))
            if index is not None and entries[index].kind == "symlink":
                inner = entries[index]
                parts = resolve(parts[:-1], inner.target or "", depth + 1)
        return parts

    start = link.path.split("/")[:-1]
    resolve(start, target, 0)
