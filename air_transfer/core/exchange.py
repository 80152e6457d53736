"""``exchange``: two paths swapped in one step (``renameat2(RENAME_EXCHANGE)``), the
atomic publish of a merged tree over an existing target."""

from __future__ import annotations

import ctypes
import errno
import os
import platform

_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
#: ``SYS_renameat2`` where libc predates its wrapper (glibc < 2.28).
_SYS_RENAMEAT2 = {"x86_64": 316, "aarch64": 276, "riscv64": 276, "ppc64le": 357, "s390x": 347}


def exchange(a: str, b: str) -> None:
    """Swap the paths ``a`` and ``b`` atomically (``renameat2(RENAME_EXCHANGE)``,
    Linux >= 3.15 on ext4, xfs, btrfs, tmpfs...). OSError EINVAL/ENOSYS/ENOTSUP where
    the system or filesystem cannot."""
    libc = _libc()
    func = getattr(libc, "renameat2", None) if libc is not None else None
    number = _SYS_RENAMEAT2.get(platform.machine())
    old, new = ctypes.c_char_p(os.fsencode(a)), ctypes.c_char_p(os.fsencode(b))
    at, flags = ctypes.c_int(_AT_FDCWD), ctypes.c_uint(_RENAME_EXCHANGE)
    if func is not None:
        result = func(at, old, at, new, flags)
    elif libc is not None and number is not None:
        result = libc.syscall(ctypes.c_long(number), at, old, at, new, flags)
    else:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), a, None, b)
    if result != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), a, None, b)


_LIBC: list[ctypes.CDLL | None] = []


def _libc() -> ctypes.CDLL | None:
    if not _LIBC:
        try:
            _LIBC.append(ctypes.CDLL(None, use_errno=True))
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]
