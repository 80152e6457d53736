"""A replicated storage loses a node: the storage node or a replica, mid-write and
mid-read, two of three, under concurrent readers; every operation goes on to a live
copy, nothing acknowledged is lost, nothing stale is served."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer.storage.client import replica_set
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.gates import Gate
from tests.support.node_storage import BODY, read
from tests.support.replicas import copies_identical, remove, replicated, view, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

BIG = os.urandom(12 * MiB + 7)  # 7 read chunks of 2 MiB: a read has more ahead than its window


@pytest.mark.parametrize("lost", ["storage node", "replica"])
def test_node_removed_mid_write(
    cluster4: Cluster, tmp_path: Path, lost: str, caplog: pytest.LogCaptureFixture
) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    doomed = node_ids()[w[0] if lost == "storage node" else w[1]]
    with caplog.at_level(logging.WARNING), fs.open_output_stream(f"{h.root}/f") as out:
        out.write(BODY[: 2 * MiB])
        remove(cluster4, doomed)
        out.write(BODY[2 * MiB :])
    # The warning names the lost node (and any other copy this write lacks).
    named = re.findall(r"completed without the copies on ([0-9a-f, ]+) \(", caplog.text)
    assert named and doomed[:12] in named[0].split(", "), caplog.text
    _, fresh, _ = view(h)
    assert doomed not in fresh
    assert read(fs, f"{h.root}/f") == BODY
    fs.create_dir(f"{h.root}/after")  # and the storage goes on
    assert copies_identical(h, 2) == {"f": BODY, "after": None}  # repaired on a live node


def test_storage_node_removed_mid_read(
    cluster4: Cluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    with fs.open_output_stream(f"{h.root}/big") as out:
        out.write(BIG)
    copies, fresh, _ = view(h)
    [(first, _), _] = replica_set.read_order(h.key, list(copies.items()), fresh, node_ids()["head"])
    with caplog.at_level(logging.WARNING), fs.open_input_stream(f"{h.root}/big") as stream:
        head = stream.read(2 * MiB)
        remove(cluster4, first)  # the copy this read is reading
        rest = stream.read()
    assert head + rest == BIG
    assert f"on node {first[:12]} was lost mid-read" in caplog.text
    assert read(fs, f"{h.root}/big") == BIG


def test_two_of_three_lost(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 3, w[0], named=(w[1], w[2]))
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(BODY)
    ids = node_ids()
    remove(cluster4, ids[w[0]])
    remove(cluster4, ids[w[1]])
    assert read(fs, f"{h.root}/f") == BODY
    with fs.open_output_stream(f"{h.root}/g") as out:
        out.write(b"after the loss")
    infos = fs.get_file_info(pafs.FileSelector(h.root))
    assert sorted(i.base_name for i in infos) == ["f", "g"]
    assert read(fs, f"{h.root}/g") == b"after the loss"


@ray.remote(num_cpus=0)
def read_until_told(fs: pafs.FileSystem, path: str, gate: object, times: int) -> list[bool]:
    """Read ``path`` once, wait at ``gate``, then ``times`` more: whether each read
    returned every byte."""
    results = [read(fs, path) == BIG]
    ray.get(gate.arrive_and_wait.remote())  # type: ignore[attr-defined]
    results += [read(fs, path) == BIG for _ in range(times)]
    return results


def test_concurrent_readers_during_failover(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    with fs.open_output_stream(f"{h.root}/big") as out:
        out.write(BIG)
    gate = Gate.options(**on("head")).remote()
    readers = [
        read_until_told.options(**on(node)).remote(fs, f"{h.root}/big", gate, 3)
        for node in ("head", w[2], w[1])
    ]
    ray.get(gate.wait_for_arrivals.remote(len(readers)))
    gate.open.remote()
    remove(cluster4, node_ids()[w[0]])  # while they read
    assert ray.get(readers, timeout=120) == [[True] * 4] * len(readers)
