"""A DCP load whose staging (an unlinked file in ``TMPDIR``) cannot take the last
tensor: the load fails saying so, and nothing of the checkpoint reached the state
dict, its non-tensor values included (without Ray: ``NodeStorageReader`` over this
disk; the staging made too small by ``RLIMIT_FSIZE``, as a full ``TMPDIR`` fails a
write)."""

from __future__ import annotations

import contextlib
import resource
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch
import torch.distributed.checkpoint as dcp

from air_transfer.dcp import NodeStorageReader, NodeStorageWriter
from air_transfer.dcp.train import _unwrapped

pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
    pytest.mark.filterwarnings("ignore:Detected an existing checkpoint"),
]
MiB = 1024 * 1024


@contextlib.contextmanager
def files_at_most(nbytes: int) -> Iterator[None]:
    """No file of this process may grow past ``nbytes`` (a write past it: EFBIG)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    before = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, before)


def test_a_staging_too_small_for_the_last_tensor_leaves_the_state_dict_untouched(
    tmp_path: Path,
) -> None:
    saved: dict[str, Any] = {
        "a": torch.full((MiB // 4,), 1.0),  # 1 MiB each, staged one after the other
        "b": torch.full((MiB // 4,), 2.0),
        "meta": {"step": 7, "note": "saved"},  # nested: DCP sets them in place
    }
    writer = NodeStorageWriter(str(tmp_path / "ckpt"), pafs.LocalFileSystem())
    _unwrapped(lambda: dcp.save(saved, storage_writer=writer, no_dist=True))
    meta = {"step": -1, "note": "before"}
    got: dict[str, Any] = {"a": torch.zeros(MiB // 4), "b": torch.zeros(MiB // 4), "meta": meta}
    reader = NodeStorageReader(str(tmp_path / "ckpt"), pafs.LocalFileSystem())
    with files_at_most(MiB + MiB // 2), pytest.raises(OSError, match="nothing was loaded"):
        _unwrapped(lambda: dcp.load(got, storage_reader=reader, no_dist=True))
    assert got["meta"] == {"step": -1, "note": "before"}
    assert not got["a"].any() and not got["b"].any()
