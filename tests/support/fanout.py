"""Fan-out of Ray Train's restores from node storage on ``node_a`` (the
``test_directory_fanout`` modules): a checkpoint there, a restore of it on
``node_b`` mid-read and a restore on the head that has asked for it too."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import ray

from air_transfer import storage_filesystem
from air_transfer.cluster.nodes import node_agent
from air_transfer.config import TransferConfig
from tests.support.checkpoints import MiB, digest_tree, make_checkpoint, on
from tests.support.cluster import node_ids
from tests.support.gates import Gate, HoldPackingAt, hold_packing
from tests.support.node_storage import read_counters
from tests.support.waiting import eventually


@ray.remote(num_cpus=0)
def restore(f: pafs.FileSystem, path: str, local: str) -> dict[str, str]:
    """What Ray Train's restore on another node does with a node-storage checkpoint."""
    from air_transfer.train.hooks import download_directory

    assert download_directory(f, path, local)
    return digest_tree(local)


def tree_size(src: Path) -> int:
    """The bytes of every file under ``src``."""
    return sum(p.stat().st_size for p in src.rglob("*") if p.is_file())


def grown(name: str, key: str, before: dict[str, Any]) -> int:
    """How much counter ``key`` of node ``name``'s agent grew since ``before``."""
    return read_counters(name)[key] - before[name][key]


@contextlib.contextmanager
def holding(tmp_path: Path, size: int, config: TransferConfig) -> Iterator[dict[str, Any]]:
    """A checkpoint of about ``size`` bytes in node storage on ``node_a`` (read with
    ``config``), a restore of it on ``node_b`` mid-read (the storage agent held at a
    gate after its first 2 MiB) and a restore of it on the head that has asked for
    it too; the gate opens at the end whatever the test did."""
    src = make_checkpoint(tmp_path / "ckpt", size)
    f = storage_filesystem(node=node_ids()["node_a"], config=config, root=str(tmp_path))
    storage = node_agent(node_ids()["node_a"])
    before = {n: read_counters(n) for n in ("node_a", "node_b")}
    gate = Gate.options(**on("head")).remote()
    hold_packing(storage, HoldPackingAt(2 * MiB, gate))
    try:
        first = restore.options(**on("node_b")).remote(f, str(src), str(tmp_path / "r1"))
        ray.get(gate.wait_for_arrivals.remote(1), timeout=60)  # the first is mid-read
        second = restore.options(**on("head")).remote(f, str(src), str(tmp_path / "r2"))
        eventually(
            lambda: grown("node_a", "bytes_served", before) == 2 * tree_size(src),
            "the second reader to ask",
            180,
        )
        yield {"src": src, "before": before, "gate": gate, "readers": [first, second]}
    finally:
        ray.get(gate.open.remote())
        hold_packing(storage, None)
