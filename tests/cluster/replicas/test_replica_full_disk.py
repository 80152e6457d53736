"""A copy whose disk fills up mid-write (ENOSPC, from a real filesystem: a small
tmpfs mounted at that copy's root) does not fail the write: it completes on the
other copy, the full one is stale (as a lost one is), and repair, which cannot fit
the copy there either, gives up on it and makes it on another node."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from ray.cluster_utils import Cluster

from tests.support.checkpoints import MiB
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.replicas import copies_identical, replicated, view, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[None]:
    """A tmpfs of ``size`` mounted at ``where`` (skips where mounting is not allowed:
    it needs CAP_SYS_ADMIN, which a CI container may not have)."""
    where.mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_copy_whose_disk_fills_up_mid_write(cluster4: Cluster, tmp_path: Path) -> None:
    from air_transfer import replica_status

    w = workers()
    full = node_ids()[w[1]]
    with small_disk(tmp_path / "copies" / full, "2m"):
        fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
        body = b"b" * (8 * MiB + 1)  # four times what the small disk holds
        with fs.open_output_stream(f"{h.root}/big") as out:
            out.write(body)
        assert full not in view(h)[1]  # stale before the write returned
        assert read(fs, f"{h.root}/big") == body

        # Repair cannot fit it there either: it gives up, and makes it on another node.
        assert copies_identical(h, 2) == {"big": body}
        [state] = [s for s in replica_status(fs) if s.node_id == full]
        assert state.state == "failed" and "No space left on device" in (state.error or "")
