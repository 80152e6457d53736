"""Node storage, the storage-node side: every path an agent is given, confined to the
storage root with no window for a symlink to lead it out.

Why not "check the real path, then use the path": between the check and the use, a
directory on the way can be replaced by a symlink out of the root (a TOCTOU race), and
the use then follows it. So a path is resolved once (``os.path.realpath``, which must
lie inside the root), and the directory that holds its last component is then opened
from the root one component at a time with ``O_NOFOLLOW``; the operation itself runs on
that last name relative to the open directory (the ``*at`` system calls: ``dir_fd=``),
never following a symlink there either. A component that became a symlink since the
resolution makes the walk fail, and the path is resolved again from the start (a few
times; then ``ELOOP``, as for a symlink loop). Whole checkpoint directories, scanned
and packed or written, are confined on the same basis (``confined_dirs``).

Residual window: a directory already opened this way that someone renames out of the
root (which takes write access both inside the root and at the destination) keeps
serving the operation in flight. Symlinks *inside* the root that point inside it are
followed wherever pyarrow's ``LocalFileSystem`` follows them (info, reads, writes,
create_dir); operations on an entry itself (delete, move) act on a symlink, not its
target, as ``unlink``/``rename`` do. Plain Python: unit-tested without Ray.
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import stat
from collections.abc import Callable, Iterator
from typing import NamedTuple, TypeVar

from air_transfer.core.placed_mark import is_stub, stub_refused

T = TypeVar("T")

#: How often a path that changed under an operation is resolved again.
ATTEMPTS = 8
#: Flags walking down to a directory: never through a symlink. ``O_PATH`` (Linux)
#: needs no read permission, only search, as a path walk does.
_STEP = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_PATH", os.O_RDONLY)
#: Flags opening a directory to read its entries.
_LISTABLE = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Raced(Exception):
    """A path changed between its resolution and its use (a component is now a
    symlink): ``at`` resolves it again. Never leaves this package."""


class Where(NamedTuple):
    """An entry, as an operation of ``at`` gets it."""

    fd: int  #: the directory holding it, opened inside the root
    name: str  #: its name in that directory ("." for the root itself)
    real: str  #: its real path (messages, staging names)


def oserror(kind: type[OSError], code: int, path: str, detail: str = "") -> OSError:
    """``kind(code, strerror + detail, path)``: errno kept, path named."""
    return kind(code, f"{os.strerror(code)}{detail}", path)


def storage_path(root: str, path: str) -> str:
    """The absolute node path that ``path`` names: itself if absolute, else under
    ``root``; normalised. PermissionError if it leaves ``root`` (lexically)."""
    if not isinstance(path, str):
        raise TypeError(f"a storage path must be a str, got {type(path).__name__}")
    if "\x00" in path:
        raise ValueError(f"storage path {path!r} contains a NUL byte")
    root = "/" + posixpath.normpath(root).lstrip("/")  # as given by a direct caller too
    joined = posixpath.normpath(posixpath.join(root, path))
    joined = "/" + joined.lstrip("/")  # normpath keeps a leading "//"
    if not inside(root, joined):
        raise PermissionError(
            errno.EACCES,
            f"outside the storage root {root!r} of this air-transfer node storage "
            f"({joined!r}); refused",
            path,
        )
    return joined


def real_root(root: str) -> str:
    """The real path of the storage root ``root`` (an absolute path; the caller's
    choice, so symlinks in it are followed)."""
    if not isinstance(root, str) or not root.startswith("/") or "\x00" in root:
        raise ValueError(f"the storage root must be an absolute path, got {root!r}")
    return os.path.realpath(root)


def checked_path(root: str, path: str) -> str:
    """``storage_path``, whose real location (symlinks resolved) is inside ``root``
    now: a check at the time of the call only (an early refusal, or a choice), never
    a licence to act on the path later; ``at`` and ``core.confined_dirs`` act race-free."""
    lexical = storage_path(root, path)
    real = resolve(lexical)
    if not inside(real_root(root), real):
        raise _escapes(root, path, real)
    return lexical


def resolve(path: str) -> str:
    """``os.path.realpath(path)``, again while a symlink on the way changes under it
    (its ``readlink`` then finds no link: EINVAL, ENOENT); OSError ELOOP if it keeps
    changing."""
    for _ in range(ATTEMPTS):
        try:
            return os.path.realpath(path)
        except OSError as e:
            if e.errno not in (errno.EINVAL, errno.ENOENT):
                raise
    raise oserror(OSError, errno.ELOOP, path, " (a path that kept changing)")


def inside(root: str, path: str) -> bool:
    return root == "/" or path == root or path.startswith(root + "/")


def at(
    root: str,
    path: str,
    op: Callable[[Where], T],
    *,
    follow: bool = True,
    make_parents: bool = False,
) -> T:
    """``op`` run on ``path`` inside ``root``, its directory held open (see above).

    ``follow``: a symlink in the last component is resolved too (info, reads,
    writes); otherwise ``op`` gets the entry itself (delete, move), and the root
    itself is refused. ``make_parents``: missing directories on the way are created.
    ``op`` raises ``Raced`` if it finds a symlink where the resolution found none.
    OSErrors name ``path``.
    """
    top = real_root(root)
    lexical = storage_path(root, path)
    if not follow and lexical == storage_path(root, ""):
        raise PermissionError(errno.EACCES, f"the storage root {root!r} itself; refused", path)
    for _ in range(ATTEMPTS):
        parts = _components(root, top, lexical, follow, path)
        try:
            fd = _walk(top, parts[:-1], make_parents, path)
            try:
                with naming(path):
                    return op(Where(fd, parts[-1] if parts else ".", posixpath.join(top, *parts)))
            finally:
                os.close(fd)
        except Raced:
            continue
    raise oserror(OSError, errno.ELOOP, path, " (a symlink loop, or a path that kept changing)")


def open_listable(where: Where) -> int:
    """The directory ``where`` opened for listing; Raced if it is now a symlink."""
    return _open_dir(where.fd, where.name, _LISTABLE, where.name)


def open_file(where: Where, flags: int) -> int:
    """The file ``where`` opened with ``flags``, never through a symlink (Raced), and
    without blocking on a FIFO (callers check what they opened)."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
    try:
        return os.open(where.name, flags, 0o666, dir_fd=where.fd)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise Raced from None
        raise


def open_regular(
    root: str, path: str, verb: str = "read", stubs_ok: bool = False
) -> tuple[int, os.stat_result]:
    """The file ``path`` (confined to ``root``) opened read-only, and its ``fstat``:
    IsADirectoryError (EISDIR) for a directory, OSError (EINVAL) for anything else
    that is not a regular file, OSError (EOPNOTSUPP) for a placed file's stub unless
    ``stubs_ok`` (its bytes are elsewhere: ``placed_mark``), ``verb`` naming what was
    refused. The caller closes the descriptor."""
    fd = at(root, path, lambda w: open_file(w, os.O_RDONLY))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise oserror(IsADirectoryError, errno.EISDIR, path, f": cannot {verb} a directory")
        if not stat.S_ISREG(st.st_mode):
            raise oserror(OSError, errno.EINVAL, path, ": not a regular file")
        if not stubs_ok and is_stub(fd):
            raise stub_refused(path, verb)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def is_symlink(st: os.stat_result) -> bool:
    return stat.S_ISLNK(st.st_mode)


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """OSErrors raised inside name ``path``: the ``*at`` calls name only the last
    component. One that already names an absolute path is left as it is."""
    try:
        yield
    except OSError as e:
        if e.errno is None or (isinstance(e.filename, str) and e.filename.startswith("/")):
            raise
        raise type(e)(e.errno, e.strerror, path) from e


def _components(root: str, top: str, lexical: str, follow: bool, path: str) -> list[str]:
    if follow:
        real = resolve(lexical)
    else:
        parent, name = posixpath.split(lexical)
        real = posixpath.join(resolve(parent), name)
    if not inside(top, real):
        raise _escapes(root, path, real)
    return [p for p in real[len(top) :].split("/") if p]


def _walk(top: str, parts: list[str], make: bool, path: str) -> int:
    """An fd of the directory ``top/parts...``, reached without following symlinks."""
    try:
        fd = os.open(top, _STEP & ~os.O_NOFOLLOW)  # the root itself may be a symlink
    except FileNotFoundError:
        if not make:
            raise oserror(FileNotFoundError, errno.ENOENT, path, " (no storage root)") from None
        os.makedirs(top, exist_ok=True)
        fd = os.open(top, _STEP & ~os.O_NOFOLLOW)
    try:
        for part in parts:
            step = _step(fd, part, make, path)
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _step(fd: int, part: str, make: bool, path: str) -> int:
    for _ in range(ATTEMPTS):
        try:
            return _open_dir(fd, part, _STEP, path)
        except FileNotFoundError:
            if not make:
                raise
        try:
            os.mkdir(part, 0o777, dir_fd=fd)
        except FileExistsError:
            pass  # made concurrently: fine
        except FileNotFoundError:
            raise Raced from None  # the directory holding it was deleted: walk again
    raise oserror(FileNotFoundError, errno.ENOENT, path, " (removed as fast as it was made)")


def _open_dir(fd: int, name: str, flags: int, path: str) -> int:
    try:
        return os.open(name, flags, dir_fd=fd)
    except FileNotFoundError:
        raise oserror(FileNotFoundError, errno.ENOENT, path) from None
    except NotADirectoryError:  # O_NOFOLLOW | O_DIRECTORY on a symlink says ENOTDIR too
        try:
            link = is_symlink(os.stat(name, dir_fd=fd, follow_symlinks=False))
        except FileNotFoundError:
            raise Raced from None
        if link:
            raise Raced from None
        raise oserror(NotADirectoryError, errno.ENOTDIR, path) from None


def _escapes(root: str, path: str, real: str) -> PermissionError:
    return PermissionError(
        errno.EACCES,
        f"leads outside the storage root {root!r} through a symlink (to {real!r}); refused",
        path,
    )
