"""Put a private copy of a file's bytes in place of a read-only mapping of it, at the
same address, so that whoever reads the mapping later (or is reading it now, in any
thread, e.g. Ray copying a task's return value into the store) reads the same bytes
from anonymous memory and a later truncate of the file cannot make that read SIGBUS.

The copy is read with ``pread`` (a read past the end of a file that shrank returns
short instead of faulting), then moved over the mapping with
``mremap(MREMAP_FIXED)``, which swaps the pages under the address space's lock: a
concurrent reader sees the old pages or the new ones, never a hole. Python's
``mmap`` cannot do either, so libc is called through ctypes; the ``mmap`` object
that owns the address still unmaps it (the copy, by then) when it is freed.
"""

from __future__ import annotations

import ctypes
import mmap
import os

_libc = ctypes.CDLL(None, use_errno=True)
_ptr, _size, _int = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
_libc.mmap.restype = _ptr
_libc.mmap.argtypes = [_ptr, _size, _int, _int, _int, ctypes.c_long]
_libc.mremap.restype = _ptr
_libc.mremap.argtypes = [_ptr, _size, _size, _int, _ptr]
_libc.mprotect.argtypes = [_ptr, _size, _int]
_libc.munmap.argtypes = [_ptr, _size]

_MAP_FAILED = ctypes.c_void_p(-1).value
# <linux/mman.h>: move the pages, to exactly the address given.
_MREMAP_MAYMOVE = 1
_MREMAP_FIXED = 2


def replace_with_copy(address: int, length: int, fd: int, offset: int) -> int:
    """Replace the read-only mapping of ``length`` bytes at ``address`` (page
    aligned; of the file open as ``fd`` from ``offset``) by a private, read-only copy
    of those bytes read from ``fd``; the number of bytes read (short: the file ended
    first; the rest of the copy is zeros). Raises OSError, the mapping untouched."""
    size = -(-length // mmap.PAGESIZE) * mmap.PAGESIZE
    copy = _libc.mmap(
        None,
        size,
        mmap.PROT_READ | mmap.PROT_WRITE,
        mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS,
        -1,
        0,
    )
    if copy is None or copy == _MAP_FAILED:
        raise _error("mmap")
    try:
        filled = _fill(copy, length, fd, offset)
        if _libc.mprotect(copy, size, mmap.PROT_READ) != 0:
            raise _error("mprotect")
        moved = _libc.mremap(copy, size, size, _MREMAP_MAYMOVE | _MREMAP_FIXED, address)
        if moved != address:
            raise _error("mremap")
    except BaseException:
        _libc.munmap(copy, size)
        raise
    return filled


def _fill(address: int, length: int, fd: int, offset: int) -> int:
    view = memoryview((ctypes.c_char * length).from_address(address)).cast("B")
    filled = 0
    while filled < length:
        n = os.preadv(fd, [view[filled:]], offset + filled)
        if not n:
            break
        filled += n
    return filled


def _error(call: str) -> OSError:
    code = ctypes.get_errno()
    return OSError(code, f"{call} of a private copy of a mapped chunk: {os.strerror(code)}")
