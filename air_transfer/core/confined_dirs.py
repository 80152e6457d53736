"""A checkpoint directory in node storage read as
a packing source, or written as a target, without leaving the storage root.

Why not check the path, then hand it on (``confine.checked_path``): the packer and
the writer resolve the path again as they go, so a directory on the way swapped for
a symlink out of the root in between leads them out. Instead:

- ``ConfinedSource`` reads a checkpoint directory (Train's restores, the agent's
  directory transfers): each open resolves its path inside the root and walks there
  without following a symlink (``confine.at``); the scan holds the directory it lists
  open and goes down without following one either (``core.scan``); and packing
  proves each file it reads is the inode the scan found (``core.proven_read``),
  of the size and mtime it had: its ctime and link count are not compared, since
  node storage never writes a file in place and an incremental save links stored
  files (docs/design.md, "Stored files").
- ``write_beneath`` writes a checkpoint (Train's reports, the storage sink): the
  target's parent is opened confined and held, and the writer is given the target
  as ``/proc/self/fd/<fd>/<name>``, which the kernel resolves from that open
  directory: a directory above it swapped later no longer matters. Errors name the
  real path again. Below the target the writer follows no symlink either: it walks
  an existing target by descriptors (``merge``) and writes into its own fresh
  staging directory next to it.

Residual: the writer fills that staging directory by paths below the held parent;
whoever can write into the root can swap a directory inside a staging directory (a
hidden name, made a moment before) for a symlink and lead those writes out.

Linux only (``/proc/self/fd``), as the rest of node storage's writes. Plain Python.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from air_transfer.core.confine import (
    Raced,
    Where,
    at,
    is_symlink,
    open_file,
    open_listable,
    resolve,
    storage_path,
)
from air_transfer.core.scan import Source


@dataclass(frozen=True)
class ConfinedSource(Source):
    """A local checkpoint directory ``root`` inside the storage root ``storage_root``,
    every file and directory of it reached inside that root (see the module)."""

    storage_root: str = "/"
    #: Node storage replaces every file it writes (``Source.replaced_not_rewritten``).
    replaced_not_rewritten: ClassVar[bool] = True

    def open(self, relpath: str) -> io.FileIO:
        fd = at(self.storage_root, self.local_path(relpath), lambda w: open_file(w, os.O_RDONLY))
        return open(fd, "rb", buffering=0)

    def open_dir(self, relpath: str = "") -> int:
        return at(self.storage_root, self._path(relpath), open_listable)

    def stat(self, relpath: str) -> os.stat_result:
        return at(self.storage_root, self._path(relpath), lstat_resolved)

    def realpath(self, relpath: str = "") -> str:
        return resolve(self._path(relpath))  # what a link names: a string, nothing read

    def _path(self, relpath: str) -> str:
        return self.local_path(relpath) if relpath else self.root


def write_beneath(root: str, path: str, write: Callable[[str], object]) -> str:
    """Run ``write(target)`` on the directory ``path`` (confined to ``root``, missing
    parents made), ``target`` naming it through its held parent (see the module);
    returns ``path`` as a node path. ``write`` must not follow a symlink at the target
    itself (one found there now is resolved inside the root first). The root itself
    cannot be written this way (PermissionError): its staging would be outside it."""

    def held(w: Where) -> None:
        if w.name == ".":
            raise PermissionError(
                errno.EACCES,
                f"the storage root {root!r} itself; refused (write into a directory inside it)",
                path,
            )
        try:
            if is_symlink(os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)):
                raise Raced  # not one when resolved: it changed meanwhile
        except FileNotFoundError:
            pass
        parent = f"/proc/self/fd/{w.fd}"
        with _named_as(parent, posixpath.dirname(w.real)):
            write(f"{parent}/{w.name}")

    at(root, path, held, make_parents=True)
    return storage_path(root, path)


def lstat_resolved(w: Where) -> os.stat_result:
    """What ``w`` is (for an ``at`` that followed links): Raced if it is a symlink,
    since the resolution found none there."""
    st = os.stat(w.name, dir_fd=w.fd, follow_symlinks=False)
    if is_symlink(st):
        raise Raced
    return st


@contextlib.contextmanager
def _named_as(held: str, real: str) -> Iterator[None]:
    """Errors raised inside name ``real`` where they say ``held`` (the ``/proc`` path
    of the directory held open): the exception itself, its type and traceback kept."""
    try:
        yield
    except BaseException as e:
        swap = _replacer(held, real)
        if isinstance(e, OSError):
            e.filename, e.filename2, e.strerror = map(swap, (e.filename, e.filename2, e.strerror))
        e.args = tuple(map(swap, e.args))
        raise


def _replacer(held: str, real: str) -> Callable[[object], Any]:
    pattern = re.compile(re.escape(held) + r"(?![0-9])")  # not /proc/self/fd/12 for 1

    def swap(value: object) -> Any:
        return pattern.sub(lambda _: real, value) if isinstance(value, str) else value

    return swap
