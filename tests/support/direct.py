"""Whether large files really went around the page cache. ``DirectFileWriter`` falls
back to the page cache without a word where a filesystem refuses ``O_DIRECT``, so a
test that claims direct writes records every writer opened and asserts that each one
stayed direct (``DirectFileWriter.direct``); it may skip only where the filesystem
provably refuses ``O_DIRECT``."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from air_transfer.core.direct_io import DirectFileWriter


def o_direct_refused(directory: str | os.PathLike[str]) -> bool:
    """Whether ``directory``'s filesystem refuses an ``O_DIRECT`` open (tmpfs before
    Linux 6.6, some FUSE and network filesystems; every one where the platform has no
    ``O_DIRECT``), tried on a scratch file there."""
    if not hasattr(os, "O_DIRECT"):
        return True
    probe = os.path.join(directory, ".o-direct-probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        if e.errno == errno.EINVAL:
            return True
        raise
    os.close(fd)
    os.remove(probe)
    return False


def skip_unless_o_direct(directory: str | os.PathLike[str]) -> None:
    if o_direct_refused(directory):
        pytest.skip(f"the filesystem of {directory} refuses O_DIRECT")


@contextlib.contextmanager
def direct_writers(module: ModuleType) -> Iterator[list[DirectFileWriter]]:
    """Every ``DirectFileWriter`` that ``module`` opens inside the block, in order (its
    ``DirectFileWriter`` is a subclass that records each instance meanwhile; what is
    written does not change). After a writer is closed, ``.direct`` says whether every
    write of it went around the page cache."""
    made: list[DirectFileWriter] = []
    real = module.DirectFileWriter

    class Recorded(real):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    module.DirectFileWriter = Recorded
    try:
        yield made
    finally:
        module.DirectFileWriter = real
