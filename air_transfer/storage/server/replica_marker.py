"""Node storage replicas, the marker in each copy's root: which storage and which
node the directory is the copy of.

Two copies in one directory are one copy counted twice: with one disk shared by
every node (an NFS mount as ``root``) or a ``replica_root`` without ``{node_id}``, a
delete hits the directory twice (one copy fails and is marked stale) and repair then
empties the stale copy's root, which is the only one. And a copy's root is emptied
whenever repair makes it again, so it must hold nothing the storage did not write.
``claim`` checks both before a directory becomes a copy (when a storage is
registered, and before repair fills a node's root), from what is on that disk, not
from the paths, which cannot tell a shared mount.

Runs in the agent of the copy's node. Plain Python: unit-tested without Ray.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import uuid
from dataclasses import dataclass

from air_transfer.core.internal_names import REPLICA_MARK, is_internal

#: The marker's name in a copy's root.
MARKER = REPLICA_MARK
_VERSION = 1


@dataclass(frozen=True)
class Marker:
    """The directory is the copy of storage ``storage`` on node ``node``."""

    storage: str
    node: str

    def to_bytes(self) -> bytes:
        d = {"version": _VERSION, "storage": self.storage, "node": self.node}
        return json.dumps(d).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Marker | None:
        """The marker ``data`` holds; None for one this version cannot read (a
        marker half written by a writer that died, or of another version)."""
        try:
            d = json.loads(data)
            if d.get("version") != _VERSION:
                return None
            return cls(str(d["storage"]), str(d["node"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


def claim(
    root: str, storage: str, node: str, members: list[str], taken: list[str], adopt: bool
) -> bool:
    """Make ``root`` (created if absent) the copy of ``storage`` on ``node``;
    whether it holds anything already. Refused (ValueError, naming the directory
    and the remedy) if it is the copy of another of ``members`` (the storage's
    copies: the two share one directory), of another storage in use (``taken``),
    or, unless ``adopt`` (the storage node's own root, which is never emptied),
    holds files and no marker (files this storage did not write). A marker left by
    a storage no longer in use (an earlier cluster) is taken over."""
    if os.path.normpath(root) == "/":
        raise ValueError(f"'/' cannot be a copy of node storage {storage}: give it a directory")
    os.makedirs(root, exist_ok=True)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        mine = Marker(storage, node)
        found = read_marker(fd)
        if found == mine:
            return _holds(fd)
        if found is not None:
            _refuse_taken(root, found, mine, members, taken)
        elif not adopt and _holds(fd):
            raise ValueError(
                f"the root of the copy of node storage {storage} on node {node[:12]}, "
                f"{root!r}, holds files this storage did not write ({_some(fd)}); repair "
                "empties a copy before it makes it again, so each copy needs a directory "
                "of its own: pass an empty one (replica_root='/path/{node_id}')"
            )
        write_marker(fd, mine)
        # Another node claiming the same directory at the same time: last one wins.
        again = read_marker(fd)
        if again != mine:
            assert again is not None
            _refuse_taken(root, again, mine, members, taken)
        return _holds(fd)
    finally:
        os.close(fd)


def _refuse_taken(
    root: str, found: Marker, mine: Marker, members: list[str], taken: list[str]
) -> None:
    if found.storage == mine.storage and found.node != mine.node and found.node in members:
        raise ValueError(
            f"the copies of node storage {mine.storage} on nodes {found.node[:12]} and "
            f"{mine.node[:12]} are one directory, {root!r} (one disk shared by the nodes, or "
            "a replica_root without {node_id}): two copies in one directory are one "
            "copy; give each node's copy a directory of its own "
            "(replica_root='/path/{node_id}')"
        )
    if found.storage != mine.storage and found.storage in taken:
        raise ValueError(
            f"{root!r} on node {mine.node[:12]} is already a copy of node storage "
            f"{found.storage}; node storage {mine.storage} needs a directory of its own"
        )


def read_marker(fd: int) -> Marker | None:
    """The marker in the directory open as ``fd``, if any."""
    try:
        handle = os.open(MARKER, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
    except FileNotFoundError:
        return None
    try:
        with open(handle, "rb", closefd=False) as f:
            return Marker.from_bytes(f.read(4096))
    finally:
        os.close(handle)


def write_marker(fd: int, marker: Marker) -> None:
    """Put ``marker`` in the directory open as ``fd``, whole (a renamed new file)."""
    temp = f"{MARKER}-{uuid.uuid4().hex}"
    handle = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=fd)
    try:
        try:
            os.write(handle, marker.to_bytes())
            os.fsync(handle)
        finally:
            os.close(handle)
        os.rename(temp, MARKER, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=fd)
        raise


def is_marker(name: str) -> bool:
    """Whether ``name`` is a marker (or one being written): emptying a copy keeps it."""
    return name.startswith(MARKER)


def _holds(fd: int) -> bool:
    return bool(_entries(fd, 1))


def _some(fd: int) -> str:
    names = _entries(fd, 4)
    return ", ".join(repr(n) for n in names[:3]) + (", ..." if len(names) > 3 else "")


def _entries(fd: int, most: int) -> list[str]:
    """Up to ``most`` names in the directory ``fd`` that are not the library's own."""
    out: list[str] = []
    try:
        with os.scandir(fd) as it:
            for entry in it:
                if not is_internal(entry.name):
                    out.append(entry.name)
                    if len(out) >= most:
                        break
    except OSError as e:
        if e.errno != errno.ENOENT:
            raise
    return out
