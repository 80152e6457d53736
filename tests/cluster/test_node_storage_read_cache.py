"""Node storage's read cache on the storage node's agent: readers on other nodes
share one read of the disk, the cache stays within a quarter of the node's object
store whatever a reader asks, and without a budget every reader reads the disk."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray

from air_transfer import storage_filesystem
from air_transfer.cluster.nodes import node_agent
from tests.support.checkpoints import MiB, on
from tests.support.cluster import STORE_BYTES, node_ids
from tests.support.node_storage import CONFIG, read, read_counters

pytestmark = pytest.mark.usefixtures("cluster")


@ray.remote(num_cpus=0)
def read_digest(f: pafs.FileSystem, path: str) -> str:
    import hashlib

    with f.open_input_stream(path) as s:
        return hashlib.sha256(s.read()).hexdigest()


def test_n_readers_on_other_nodes_read_the_file_from_disk_once(tmp_path: Path) -> None:
    """Three readers of one file, on two other nodes, at once: the storage node packs
    each chunk once and serves the same objects to all (the agent's counters)."""
    import hashlib

    body = os.urandom(9 * MiB + 5)
    (tmp_path / "ckpt.bin").write_bytes(body)
    f = storage_filesystem(node=node_ids()["node_a"], config=CONFIG, root=str(tmp_path))
    before = read_counters("node_a")
    readers = [
        read_digest.options(**on(node)).remote(f, str(tmp_path / "ckpt.bin"))
        for node in ("head", "node_b", "node_b")
    ]
    assert ray.get(readers) == [hashlib.sha256(body).hexdigest()] * 3
    after = read_counters("node_a")
    assert after["bytes_read"] - before["bytes_read"] == len(body)
    assert after["bytes_served"] - before["bytes_served"] == 3 * len(body)


def test_a_storage_node_keeps_at_most_a_quarter_of_its_store_whatever_readers_ask(
    tmp_path: Path,
) -> None:
    """A reader asking for a cache larger than the storage node's object store (the
    default 1 GiB on a small node) gets its file whole, and the node keeps at most a
    quarter of its store: a cache filling it would make Ray spill the chunks."""
    import hashlib

    cap = STORE_BYTES // 4
    body = os.urandom(cap + 6 * MiB)
    (tmp_path / "big.bin").write_bytes(body)
    config = CONFIG.replace(cache_bytes=4 * STORE_BYTES)
    f = storage_filesystem(node=node_ids()["node_a"], config=config, root=str(tmp_path))
    ray.get(node_agent(node_ids()["node_a"]).clear_read_cache.remote())
    digest = read_digest.options(**on("node_b")).remote(f, str(tmp_path / "big.bin"))
    assert ray.get(digest) == hashlib.sha256(body).hexdigest()
    assert 0 < read_counters("node_a")["bytes_held"] <= cap


def test_without_a_cache_budget_every_reader_reads_the_disk(tmp_path: Path) -> None:
    body = os.urandom(5 * MiB)
    (tmp_path / "ckpt.bin").write_bytes(body)
    f = storage_filesystem(
        node=node_ids()["node_a"], config=CONFIG.replace(cache_bytes=0), root=str(tmp_path)
    )
    before = read_counters("node_a")
    for _ in range(2):
        assert read(f, str(tmp_path / "ckpt.bin")) == body
    assert read_counters("node_a")["bytes_read"] - before["bytes_read"] == 2 * len(body)
    assert read_counters("node_a")["bytes_held"] == 0
