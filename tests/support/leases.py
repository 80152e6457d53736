"""Helpers for the read-lease tests of mapped packing: whether a file is leased, a
process holding a file open for writing, a truncate by another process (and a
packer stalled until it went through), whether this process maps a file, and the
kernel's view of a lease break."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.waiting import eventually


def leased(path: Path) -> bool:
    """Whether someone holds a lease on ``path``, as the kernel lists them: a probe
    by a non-blocking open for writing would start breaking the lease (and the
    holder hands a broken lease back at once)."""
    return lease_listed(str(path))


def hold_open_for_write(path: Path) -> subprocess.Popen[str]:
    """Another process with ``path`` open for writing (until its stdin closes)."""
    code = (
        "import os, sys; fd = os.open(sys.argv[1], os.O_WRONLY); "
        "print('ready', flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    return child


def truncate_elsewhere(path: str) -> subprocess.Popen[bytes]:
    """Another process truncating ``path`` to 0 bytes (it waits while it is leased)."""
    code = "import os, sys; os.truncate(sys.argv[1], 0)"
    return subprocess.Popen([sys.executable, "-c", code, path])


#: How long a packer stalled while holding a lease waits for another process's
#: truncate: well inside the kernel's lease-break-time (45 s), after which a packer
#: that keeps its lease would have it revoked and crash (SIGBUS) when it resumes; a
#: packer that hands a broken lease back lets the truncate through in milliseconds.
STALL_S = 20.0


def truncated_while_stalled(path: str) -> None:
    """Be a packer stalled while it holds ``path``'s lease: another process
    truncates the file to 0 bytes, and this returns once the truncate went through
    (AssertionError after ``STALL_S``: the truncate still waits for the lease)."""
    child = truncate_elsewhere(path)
    eventually(
        lambda: child.poll() is not None,
        "the truncate to go through while the packer stalls holding the lease",
        STALL_S,
    )
    assert child.returncode == 0


def truncate_now(path: Path) -> bool:
    """Truncate ``path`` to 0 bytes unless that would wait for a lease (this starts
    breaking it, as a blocking truncate would): whether it was truncated."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NONBLOCK)
    except BlockingIOError:
        return False
    os.close(fd)
    return True


def mapped_here(path: str) -> bool:
    """Whether this process maps any part of ``path`` (``/proc/self/maps``)."""
    with open("/proc/self/maps") as f:
        return any(line.rstrip("\n").endswith(" " + path) for line in f)


def lease_breaking(path: str) -> bool:
    """Whether the kernel lists a lease on ``path`` that a writer is breaking (the
    writer is then waiting for it)."""
    return any("BREAKING" in line for line in _leases_of(path))


def lease_listed(path: str) -> bool:
    """Whether the kernel lists a lease on ``path`` at all."""
    return bool(_leases_of(path))


def _leases_of(path: str) -> list[str]:
    """The kernel's lines for the leases on ``path`` (``/proc/locks``)."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino} "
    with open("/proc/locks") as f:
        return [line for line in f if "LEASE" in line and inode in line]


def _set_while_mapped(agent: Any, hook: Any) -> None:
    from air_transfer.core import packer

    packer._while_mapped = hook


def install_while_mapped(agent: Any, hook: Any) -> None:
    """Set (or with None, clear) ``packer._while_mapped`` in node agent ``agent``."""
    import ray

    ray.get(agent.__ray_call__.remote(_set_while_mapped, hook))
