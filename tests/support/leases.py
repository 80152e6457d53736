"""Helpers for the read-lease tests of mapped packing: whether a file is leased (an
open for writing that would wait says so), a process holding a file open for
writing, a truncate by another process, and the kernel's view of a lease break."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def leased(path: Path) -> bool:
    """Whether someone holds a lease on ``path``: a non-blocking open for writing
    then fails with EWOULDBLOCK instead of waiting for the lease to be released."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
    except BlockingIOError:
        return True
    os.close(fd)
    return False


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
