"""``torch.save``'s crc32 of every record, skipped while a DCP file streams into node
storage: ``without_crc32``.

DCP writes each tensor with ``torch.save``, whose zip writer computes a crc32 of
every record: ~0.21 s of CPU per 300 MiB saved (about 1.4 GB/s, measured here),
about a third of a rank's save into node storage. ``torch.load`` never checks it
(a record with a flipped byte loads), and node storage checksums every chunk with
xxh3-128 from the writer's buffer to the stored file and again on every read, so the
crc32 protects nothing there.

torch's switch is its serialization config (``set_crc32_options``), whose overrides
are per thread from torch 2.13 on: the patch covers the thread writing the file and
no other ``torch.save`` of the process (the user's own, another thread's). Before
2.13 it was process-wide, so there the crc32 stays.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.utils.serialization import config

#: The first torch whose config overrides are per thread (a ``ContextVar``).
PER_THREAD_FROM = (2, 13)


def _release(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def without_crc32() -> contextlib.AbstractContextManager[None]:
    """Within this context (this thread, until it ends), ``torch.save`` writes its
    records without computing their crc32 (the zip's crc fields are 0); on a torch
    before 2.13, a context that changes nothing."""
    if _release(torch.__version__) < PER_THREAD_FROM:
        return contextlib.nullcontext()
    return _patched()


@contextlib.contextmanager
def _patched() -> Iterator[None]:
    # ``patch`` is put on the module when torch installs it as a config module.
    with config.patch({"save.compute_crc32": False}):  # type: ignore[attr-defined]
        yield
