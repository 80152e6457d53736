"""The one tree remover, ``core.tree_removal.remove_tree`` (``rmtree`` for a path), by both
entry shapes: any depth on one descriptor, no symlink followed, no mount point
entered, read-only directories removed (no Ray); a tree that changes while it is
removed: ``test_remove_tree_races``.

Tests that change the process (its limit on open files, its user, its mounts) run in
a forked child: ``in_child``."""

from __future__ import annotations

import ctypes
import errno
import itertools
import os
import resource
import select
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from air_transfer.core.dirtree import Level, walk_dirs
from air_transfer.core.tree_removal import rmtree
from tests.support.removers import by_entry, by_path

_DIR = os.O_RDONLY | os.O_DIRECTORY

Remove = Callable[[Path], int]
removers = pytest.mark.parametrize("remove", [by_path, by_entry], ids=["path", "entry"])


def deep_tree(top: Path, depth: int) -> None:
    """``top/d/d/.../d/f``, ``depth`` levels below ``top``, made relative to one open
    directory (a path that long would pass PATH_MAX)."""
    top.mkdir()
    fd = os.open(top, _DIR)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            below = os.open("d", _DIR, dir_fd=fd)
            os.close(fd)
            fd = below
        os.close(os.open("f", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


#: The exit status of a child that could not run its test (``in_child``).
SKIP = 77


def in_child(fn: Callable[[], None], timeout_s: float = 60.0) -> int:
    """Run ``fn`` in a forked child and return its exit status: 0, or ``SKIP`` if it
    exited so; an exception in ``fn`` (or any other end) fails the test."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never back into pytest
        os.close(r)
        code = 0
        try:
            fn()
        except BaseException:
            os.write(w, traceback.format_exc().encode())
            code = 1
        finally:
            os._exit(code)
    os.close(w)
    out = b""
    deadline = time.monotonic() + timeout_s
    try:
        while chunk := _read_by(r, deadline):
            out += chunk
    except TimeoutError:
        os.kill(pid, 9)
        raise
    finally:
        os.close(r)
        _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, SKIP), f"the child ended with {code}: {out.decode()}"
    return code


def _read_by(fd: int, deadline: float) -> bytes:
    if not select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
        raise TimeoutError("the child did not finish in time")
    return os.read(fd, 65536)


def test_removes_any_depth_and_read_only_directories(tmp_path: Path) -> None:
    """1,500 levels (a recursive remover stops at Python's recursion limit), the
    first one closed to all and the last one read-only; a missing path is fine."""
    deep_tree(tmp_path / "t", 1500)  # past Python's recursion limit
    os.chmod(os.path.join(tmp_path, "t", *["d"] * 1500), 0o500)
    os.chmod(tmp_path / "t" / "d", 0o000)
    assert rmtree(str(tmp_path / "t")) == 1502
    assert os.listdir(tmp_path) == []
    assert rmtree(str(tmp_path / "t")) == 0  # missing: fine


@removers
def test_a_tree_deeper_than_the_limit_on_open_files_is_removed(
    tmp_path: Path, remove: Remove
) -> None:
    """With room for 32 more descriptors, a tree 100 levels deep is removed; a walk
    holding a descriptor per level (``walk_dirs``) runs out: the limit is real."""
    deep_tree(tmp_path / "t", 100)
    deep_tree(tmp_path / "probe", 100)

    def child() -> None:
        soft = room_for(32)
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (soft, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )
        with pytest.raises(OSError) as ran_out:
            walk_dirs(Level(os.open(tmp_path / "probe", _DIR), -1, "", ""), _subdirs)
        assert ran_out.value.errno == errno.EMFILE
        assert remove(tmp_path / "t") == 102
        assert not (tmp_path / "t").exists()

    in_child(child)


def room_for(n: int) -> int:
    """A limit on open files that leaves room for about ``n`` more descriptors (the
    lowest free numbers are used first; those open above the limit stay open)."""
    used = {int(fd) for fd in os.listdir("/proc/self/fd")}
    free = (fd for fd in itertools.count() if fd not in used)
    return next(itertools.islice(free, n - 1, None)) + 1


def _subdirs(level: Level) -> list[str]:
    return [e.name for e in os.scandir(level.fd) if e.is_dir(follow_symlinks=False)]


@removers
def test_a_symlink_inside_is_removed_not_followed(tmp_path: Path, remove: Remove) -> None:
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep").write_bytes(b"k")
    (outside / "sub" / "keep").write_bytes(b"s")
    (tmp_path / "t" / "a").mkdir(parents=True)
    os.symlink(outside, tmp_path / "t" / "link")
    os.symlink(outside / "keep", tmp_path / "t" / "a" / "file_link")
    os.symlink("..", tmp_path / "t" / "a" / "up")
    assert remove(tmp_path / "t") == 5
    assert sorted(os.listdir(tmp_path)) == ["outside"]
    assert (outside / "keep").read_bytes() == b"k"
    assert (outside / "sub" / "keep").read_bytes() == b"s"
    os.symlink(outside, tmp_path / "top_link")
    assert remove(tmp_path / "top_link") == 1  # the link itself goes, not what it points to
    assert (outside / "keep").exists() and not (tmp_path / "top_link").exists()


@removers
def test_read_only_directories_are_removed_by_their_owner(tmp_path: Path, remove: Remove) -> None:
    """Directories its owner may not list, search or write in, the top among them:
    each gets owner rwx first. Root may do all that anyway: run as another user."""
    (tmp_path / "t" / "ro" / "s").mkdir(parents=True)
    for d in ("blind", "shut"):
        (tmp_path / "t" / d).mkdir()
        (tmp_path / "t" / d / "f").write_bytes(b"x")
    (tmp_path / "t" / "ro" / "f").write_bytes(b"x")
    (tmp_path / "t" / "ro" / "s" / "f").write_bytes(b"x")
    modes = {"ro/s": 0o555, "ro": 0o500, "blind": 0o300, "shut": 0o000, "": 0o500}

    def child() -> None:
        if os.geteuid() == 0:
            nobody = 65534
            for p in [tmp_path, *tmp_path.rglob("*")]:
                os.chown(p, nobody, nobody)
            os.chdir(tmp_path)  # its parents stay closed to that user
            os.setgroups([])
            os.setgid(nobody)
            os.setuid(nobody)
        else:
            os.chdir(tmp_path)
        for d, mode in modes.items():
            os.chmod(Path("t", d), mode)
        assert remove(Path("t")) == 9
        assert os.listdir(".") == []

    in_child(child)


@removers
def test_a_mount_point_inside_is_not_entered(tmp_path: Path, remove: Remove) -> None:
    """Like ``rm --one-file-system``: EXDEV naming the mount point, nothing under it
    removed. The child mounts a tmpfs in a mount namespace of its own."""
    (tmp_path / "t" / "mnt").mkdir(parents=True)

    def child() -> None:
        if not _private_mounts() or not _mount_tmpfs(tmp_path / "t" / "mnt"):
            os._exit(SKIP)
        (tmp_path / "t" / "mnt" / "keep").write_bytes(b"k")
        with pytest.raises(OSError) as refused:
            remove(tmp_path / "t")
        assert refused.value.errno == errno.EXDEV
        assert refused.value.filename == str(tmp_path / "t" / "mnt")
        assert (tmp_path / "t" / "mnt" / "keep").read_bytes() == b"k"

    if in_child(child) == SKIP:
        pytest.skip("no mount namespace for this process (unshare refused)")


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _private_mounts() -> bool:
    """A mount namespace of this process's own, in a user namespace if it must be."""
    clone_newns, clone_newuser = 0x20000, 0x10000000
    uid, gid = os.geteuid(), os.getegid()
    if _libc().unshare(clone_newns) != 0:
        if _libc().unshare(clone_newuser | clone_newns) != 0:
            return False
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    ms_rec, ms_private = 0x4000, 1 << 18  # nothing mounted here shows outside
    return bool(_libc().mount(b"none", b"/", None, ms_rec | ms_private, None) == 0)


def _mount_tmpfs(where: Path) -> bool:
    return bool(_libc().mount(b"tmpfs", str(where).encode(), b"tmpfs", 0, None) == 0)
