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
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import xxhash

from air_transfer.config import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from air_transfer.core.links import check_links
from air_transfer.errors import ManifestError

SCHEMA_VERSION = 1
CHECKSUM_ALGORITHM = "xxh3_128"
_CHECKSUM_HEX_LEN = 32
_CHECKSUM_RE = re.compile(f"[0-9a-f]{{{_CHECKSUM_HEX_LEN}}}")

# What the writer can apply: a value outside these would fail there (OverflowError,
# ENAMETOOLONG...) after bytes were transferred, so decoding refuses it first.
#: A file name's bytes (NAME_MAX).
MAX_NAME_BYTES = 255
#: A path's or a symlink target's bytes (PATH_MAX less its NUL).
MAX_PATH_BYTES = 4095
#: A file size must fit an off_t.
MAX_FILE_BYTES = 2**63 - 1
#: ``os.utime(ns=...)`` takes a signed 64-bit count of nanoseconds (before 1970 too).
MIN_MTIME_NS, MAX_MTIME_NS = -(2**63), 2**63 - 1
#: Permission bits, setuid/setgid/sticky included: all that chmod applies.
MAX_MODE = 0o7777

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


def check_relative_path(path: object) -> str:
    """Return ``path`` if it is a safe relative POSIX path the writer can create, else
    raise ManifestError.

    Safe means: a non-empty str, not absolute, no NUL, no empty, ``.`` or ``..``
    segment, so joined under any directory it stays under it; and creatable: it encodes
    to file-name bytes (see ``_fs_bytes``), no segment is longer than NAME_MAX (255) bytes
    and the whole is at most PATH_MAX - 1 (4095) bytes.
    """
    if not isinstance(path, str) or not path:
        raise ManifestError(f"manifest path {_short(path)} must be a non-empty string")
    if path.startswith("/"):
        raise ManifestError(f"manifest path {_short(path)} is absolute")
    size = -1
    for name in path.split("/"):
        size += 1 + _check_name(path, name)
    _check_path_size(path, size)
    return path


def _check_name(path: str, name: str) -> int:
    """Check one segment of ``path``; return its length in bytes."""
    if name in ("", ".", ".."):
        raise ManifestError(
            f"manifest path {_short(path)} has a {name or 'empty'!r} segment; "
            "only plain relative paths are allowed"
        )
    if "\x00" in name:
        raise ManifestError(f"manifest path {_short(path)} contains a NUL byte")
    size = len(name) if name.isascii() else len(_fs_bytes(name, f"manifest path {path!r}"))
    if size > MAX_NAME_BYTES:
        raise ManifestError(
            f"manifest path {_short(path)} has a segment of {size} bytes, more "
            f"than the {MAX_NAME_BYTES} a file name may have (NAME_MAX)"
        )
    return size


def _check_path_size(path: str, size: int) -> None:
    if size > MAX_PATH_BYTES:
        raise ManifestError(
            f"manifest path {_short(path)} is {size} bytes long, more than the "
            f"{MAX_PATH_BYTES} a path may have (PATH_MAX)"
        )


def _fs_bytes(text: str, what: str) -> bytes:
    """The bytes ``text`` names on disk, as ``os.fsencode`` makes them on Linux (UTF-8,
    undecodable bytes carried as the surrogates U+DC80..U+DCFF that ``os.listdir``
    returns for them, so checkpoints with such names still travel).

    Refused: a lone surrogate no file name decodes to (the writer's ``os.mkdir`` would
    raise UnicodeEncodeError), and escapes of bytes that are valid UTF-8 (``\\udcc3\\udca9``
    would name the same file as ``é``: two entries, one file).
    """
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError as e:
        raise ManifestError(
            f"{what} cannot be encoded as a file name: {e.reason} at character {e.start}"
        ) from e
    if raw.decode("utf-8", "surrogateescape") != text:
        raise ManifestError(
            f"{what} escapes bytes that are valid UTF-8, so it would name the same file "
            "as their UTF-8 text; list the decoded name instead"
        )
    return raw


def _short(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to a readable length: a 4 KiB path in a message helps nobody."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]!r}... ({len(value)} characters)"
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def _check_int(name: str, value: object, path: str | None, low: int, high: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        of = f" of {_short(path)}" if path is not None else ""
        raise ManifestError(
            f"manifest {name}{of} must be an int in [{low}, {high}] ({why}), got {_short(value)}"
        )
    return value


def _validate(m: Manifest) -> tuple[dict[str, int], tuple[int, ...], int]:
    """One pass over the entries, then one over the links: linear in the manifest."""
    if type(m.schema_version) is not int or m.schema_version != SCHEMA_VERSION:
        raise ManifestError(f"manifest schema_version {m.schema_version!r} unsupported")
    if not isinstance(m.checksum, str) or m.checksum != CHECKSUM_ALGORITHM:
        raise ManifestError(
            f"manifest checksum algorithm {m.checksum!r} unsupported "
            f"(expected {CHECKSUM_ALGORITHM!r})"
        )
    _check_int(
        "chunk_bytes",
        m.chunk_bytes,
        None,
        MIN_CHUNK_BYTES,
        MAX_CHUNK_BYTES,
        "TransferConfig's MIN_CHUNK_BYTES..MAX_CHUNK_BYTES",
    )

    by_path: dict[str, int] = {}
    offsets: list[int] = []
    sizes: list[int] = []  # of each path, in bytes
    offset = 0
    has_links = False
    for index, e in enumerate(m.entries):
        if not isinstance(e, Entry):
            raise ManifestError(f"manifest entry {e!r} is not an Entry")
        path = e.path
        if not isinstance(path, str) or not path or path.startswith("/"):
            check_relative_path(path)  # raises, naming the problem
        parent, _, name = path.rpartition("/")
        # Only the last name is new: the parent was checked when it was listed, so
        # validation is linear in the names, not in the paths (2,000 segments deep).
        parent_index = _check_parent(m, index, path, parent, by_path)
        size = _check_name(path, name) + (sizes[parent_index] + 1 if parent else 0)
        _check_path_size(path, size)
        if path in by_path:
            raise ManifestError(f"manifest lists {_short(path)} twice")
        if not isinstance(e.kind, str) or e.kind not in _KINDS:
            raise ManifestError(
                f"manifest entry {_short(path)} has unknown kind {e.kind!r} "
                f"(known: {', '.join(_KINDS)})"
            )
        _check_int("size", e.size, path, 0, MAX_FILE_BYTES, "a file size must fit an off_t")
        _check_int("mtime_ns", e.mtime_ns, path, MIN_MTIME_NS, MAX_MTIME_NS, "a signed 64-bit time")
        if isinstance(e.mode, int) and not isinstance(e.mode, bool) and e.mode > MAX_MODE:
            raise ManifestError(
                f"manifest mode {e.mode:o} of {_short(path)} has non-permission bits "
                f"(only 0..{MAX_MODE:o} can be applied with chmod)"
            )
        _check_int("mode", e.mode, path, 0, MAX_MODE, "permission bits only")
        if e.kind != "file" and e.size != 0:
            raise ManifestError(f"manifest {e.kind} {_short(path)} has size {e.size}, must be 0")
        if e.kind == "symlink":
            _check_target_text(path, e.target)
            has_links = True
        elif e.target is not None:
            raise ManifestError(f"manifest {e.kind} {_short(path)} has a link target")
        by_path[path] = index
        sizes.append(size)
        offsets.append(offset)
        if e.kind == "file":
            offset += e.size

    if has_links:
        check_links({e.path: (e.kind, e.target) for e in m.entries})

    total = offset
    if m.chunks is None:
        return by_path, tuple(offsets), total
    for i, c in enumerate(m.chunks):
        if not isinstance(c, str) or not _CHECKSUM_RE.fullmatch(c):
            raise ManifestError(
                f"manifest checksum of chunk {i} is malformed: {_short(c)} (expected "
                f"{_CHECKSUM_HEX_LEN} lowercase hex digits)"
            )
    expected = -(-total // m.chunk_bytes)
    if len(m.chunks) != expected:
        raise ManifestError(
            f"manifest sizes are inconsistent: {total} bytes of files in chunks of "
            f"{m.chunk_bytes} make {expected} chunks, but {len(m.chunks)} checksums "
            "are listed"
        )
    return by_path, tuple(offsets), total


def _check_parent(
    m: Manifest, index: int, path: str, parent: str, by_path: Mapping[str, int]
) -> int:
    """Return the index of ``path``'s parent, which must be a directory entry listed
    earlier: the writer creates entries in manifest order, and writing "a/b" where "a"
    is a symlink would follow the link, possibly out of the target. -1 for the root."""
    if not parent:
        return -1
    at = by_path.get(parent)
    if at is not None and m.entries[at].kind == "dir":
        return at
    check_relative_path(path)  # a bad segment is the better message
    if at is None and any(isinstance(e, Entry) and e.path == parent for e in m.entries[index:]):
        raise ManifestError(
            f"manifest entry {_short(path)} is listed before its parent {_short(parent)}; "
            "parents must come first (the writer creates entries in manifest order)"
        )
    raise ManifestError(
        f"manifest entry {_short(path)} has parent {_short(parent)} that is not a "
        "directory entry of the manifest"
    )


def _check_target_text(path: str, target: object) -> None:
    """What ``os.symlink`` would refuse, and absolute targets (outside by definition);
    where a relative target leads is ``check_links``'s job."""
    if not isinstance(target, str) or not target or "\x00" in target:
        raise ManifestError(f"manifest symlink {_short(path)} has invalid target {_short(target)}")
    if target.startswith("/"):
        raise ManifestError(f"manifest symlink {_short(path)} -> {_short(target)} is absolute")
    what = f"manifest symlink {_short(path)} -> {_short(target)}"
    size = len(target) if target.isascii() else len(_fs_bytes(target, what))
    if size > MAX_PATH_BYTES:
        raise ManifestError(
            f"manifest symlink {_short(path)} has a target of {size} bytes, more than the "
            f"{MAX_PATH_BYTES} a symlink may hold (PATH_MAX)"
        )
