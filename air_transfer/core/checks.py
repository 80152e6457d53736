"""Validation of a manifest's fields: one pass over the entries, then one over the
links, linear in the manifest whatever its shape. A manifest that passes can be
written under any directory without leaving it (``Manifest`` runs this on every
construction, so a ``Manifest`` object is always safe)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from air_transfer.config import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from air_transfer.core.checksum import CHECKSUM_ALGORITHM, CHECKSUM_HEX_LEN, is_checksum
from air_transfer.core.entry import KINDS, Entry
from air_transfer.core.links import check_links
from air_transfer.core.names import (
    MAX_PATH_BYTES,
    check_name,
    check_path_size,
    check_relative_path,
    fs_bytes,
    short,
)
from air_transfer.errors import ManifestError

SCHEMA_VERSION = 1
#: A file size must fit an off_t.
MAX_FILE_BYTES = 2**63 - 1
#: ``os.utime(ns=...)`` takes a signed 64-bit count of nanoseconds (before 1970 too).
MIN_MTIME_NS, MAX_MTIME_NS = -(2**63), 2**63 - 1
#: Permission bits, setuid/setgid/sticky included: all that chmod applies.
MAX_MODE = 0o7777


def _check_int(name: str, value: object, path: str | None, low: int, high: int, why: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        of = f" of {short(path)}" if path is not None else ""
        raise ManifestError(
            f"manifest {name}{of} must be an int in [{low}, {high}] ({why}), got {short(value)}"
        )
    return value


def validate(
    entries: Sequence[Entry],
    chunk_bytes: int,
    chunks: Sequence[str] | None,
    schema_version: int = SCHEMA_VERSION,
    checksum: str = CHECKSUM_ALGORITHM,
) -> tuple[dict[str, int], tuple[int, ...], int]:
    """Check a manifest's fields; return its path index, each entry's stream offset and
    the total file bytes. Raises ManifestError naming the first problem."""
    if type(schema_version) is not int or schema_version != SCHEMA_VERSION:
        raise ManifestError(f"manifest schema_version {schema_version!r} unsupported")
    if not isinstance(checksum, str) or checksum != CHECKSUM_ALGORITHM:
        raise ManifestError(
            f"manifest checksum algorithm {checksum!r} unsupported "
            f"(expected {CHECKSUM_ALGORITHM!r})"
        )
    _check_int(
        "chunk_bytes",
        chunk_bytes,
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
    for index, e in enumerate(entries):
        if not isinstance(e, Entry):
            raise ManifestError(f"manifest entry {e!r} is not an Entry")
        path = e.path
        if not isinstance(path, str) or not path or path.startswith("/"):
            check_relative_path(path)  # raises, naming the problem
        parent, _, name = path.rpartition("/")
        # Only the last name is new: the parent was checked when it was listed, so
        # validation is linear in the names, not in the paths (2,000 segments deep).
        parent_index = _check_parent(entries, index, path, parent, by_path)
        size = check_name(path, name) + (sizes[parent_index] + 1 if parent else 0)
        check_path_size(path, size)
        if path in by_path:
            raise ManifestError(f"manifest lists {short(path)} twice")
        if not isinstance(e.kind, str) or e.kind not in KINDS:
            raise ManifestError(
                f"manifest entry {short(path)} has unknown kind {e.kind!r} "
                f"(known: {', '.join(KINDS)})"
            )
        _check_int("size", e.size, path, 0, MAX_FILE_BYTES, "a file size must fit an off_t")
        _check_int("mtime_ns", e.mtime_ns, path, MIN_MTIME_NS, MAX_MTIME_NS, "a signed 64-bit time")
        if isinstance(e.mode, int) and not isinstance(e.mode, bool) and e.mode > MAX_MODE:
            raise ManifestError(
                f"manifest mode {e.mode:o} of {short(path)} has non-permission bits "
                f"(only 0..{MAX_MODE:o} can be applied with chmod)"
            )
        _check_int("mode", e.mode, path, 0, MAX_MODE, "permission bits only")
        if e.kind != "file" and e.size != 0:
            raise ManifestError(f"manifest {e.kind} {short(path)} has size {e.size}, must be 0")
        if e.kind == "symlink":
            _check_target_text(path, e.target)
            has_links = True
        elif e.target is not None:
            raise ManifestError(f"manifest {e.kind} {short(path)} has a link target")
        by_path[path] = index
        sizes.append(size)
        offsets.append(offset)
        if e.kind == "file":
            offset += e.size

    if has_links:
        check_links({e.path: (e.kind, e.target) for e in entries})

    total = offset
    if chunks is None:
        return by_path, tuple(offsets), total
    for i, c in enumerate(chunks):
        if not is_checksum(c):
            raise ManifestError(
                f"manifest checksum of chunk {i} is malformed: {short(c)} (expected "
                f"{CHECKSUM_HEX_LEN} lowercase hex digits)"
            )
    expected = -(-total // chunk_bytes)
    if len(chunks) != expected:
        raise ManifestError(
            f"manifest sizes are inconsistent: {total} bytes of files in chunks of "
            f"{chunk_bytes} make {expected} chunks, but {len(chunks)} checksums "
            "are listed"
        )
    return by_path, tuple(offsets), total


def _check_parent(
    entries: Sequence[Entry], index: int, path: str, parent: str, by_path: Mapping[str, int]
) -> int:
    """Return the index of ``path``'s parent, which must be a directory entry listed
    earlier: the writer creates entries in manifest order, and writing "a/b" where "a"
    is a symlink would follow the link, possibly out of the target. -1 for the root."""
    if not parent:
        return -1
    at = by_path.get(parent)
    if at is not None and entries[at].kind == "dir":
        return at
    check_relative_path(path)  # a bad segment is the better message
    if at is None and any(isinstance(e, Entry) and e.path == parent for e in entries[index:]):
        raise ManifestError(
            f"manifest entry {short(path)} is listed before its parent {short(parent)}; "
            "parents must come first (the writer creates entries in manifest order)"
        )
    raise ManifestError(
        f"manifest entry {short(path)} has parent {short(parent)} that is not a "
        "directory entry of the manifest"
    )


def _check_target_text(path: str, target: object) -> None:
    """What ``os.symlink`` would refuse, and absolute targets (outside by definition);
    where a relative target leads is ``check_links``'s job."""
    if not isinstance(target, str) or not target or "\x00" in target:
        raise ManifestError(f"manifest symlink {short(path)} has invalid target {short(target)}")
    if target.startswith("/"):
        raise ManifestError(f"manifest symlink {short(path)} -> {short(target)} is absolute")
    what = f"manifest symlink {short(path)} -> {short(target)}"
    size = len(target) if target.isascii() else len(fs_bytes(target, what))
    if size > MAX_PATH_BYTES:
        raise ManifestError(
            f"manifest symlink {short(path)} has a target of {size} bytes, more than the "
            f"{MAX_PATH_BYTES} a symlink may hold (PATH_MAX)"
        )
