"""Races of a replicated storage: writes racing the loss of the storage node, and a
copy that missed a write and a delete (its agent died mid-write) that is never
read until repair has made it whole again."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer import TransferConfig, node_agent
from air_transfer.storage.client.replica_set import registry
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.replicas import (
    copies_identical,
    read_local,
    remove,
    replicated,
    top_up,
    tree,
    view,
    workers,
)
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


def test_writes_racing_the_loss_of_the_storage_node(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    bodies = {f"f{i}": os.urandom(MiB + i) for i in range(8)}
    outcome: dict[str, BaseException | None] = {}
    first_done = threading.Event()

    def writer() -> None:
        for name, body in bodies.items():
            try:
                with fs.open_output_stream(f"{h.root}/{name}") as out:
                    out.write(body)
                outcome[name] = None
            except Exception as e:  # a write that raised: absent or whole, never partial
                outcome[name] = e
            first_done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    first_done.wait(120)
    remove(cluster4, node_ids()[w[0]])
    thread.join(300)
    assert not thread.is_alive() and len(outcome) == len(bodies)
    assert outcome["f0"] is None
    for name, error in outcome.items():  # every write that returned is stored
        if error is None:
            assert read(fs, f"{h.root}/{name}") == bodies[name]
    stored = copies_identical(h, 2)
    assert all(stored[name] == bodies[name] for name in stored)  # nothing partial
    assert {n for n, e in outcome.items() if e is None} <= set(stored)


def test_a_copy_that_missed_changes_is_never_read(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    replica = node_ids()[w[1]]
    for name in ("f", "g"):
        with fs.open_output_stream(f"{h.root}/{name}") as out:
            out.write(b"v1" * MiB)
    with fs.open_output_stream(f"{h.root}/f") as out:  # its agent dies mid-write
        out.write(b"v2" * MiB)
        ray.kill(node_agent(replica))
        out.write(b"v2" * MiB)
    _, fresh, _ = view(h)
    assert replica not in fresh  # marked before close returned
    fs.delete_file(f"{h.root}/g")
    # A reader on the stale copy's node (which prefers its own disk) reads the others'.
    assert ray.get(read_local.options(**on(w[1])).remote(fs, f"{h.root}/f")) == b"v2" * 2 * MiB
    assert ray.get(read_local.options(**on(w[1])).remote(fs, f"{h.root}/g")) is None
    assert copies_identical(h, 2) == {"f": b"v2" * 2 * MiB}  # repaired, the delete included
    copies, _, _ = view(h)
    assert replica in copies and tree(copies[replica]) == {"f": b"v2" * 2 * MiB}


def test_a_lost_copy_is_made_again_on_a_live_node(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 3, w[0], named=(w[1], w[2]))
    body = os.urandom(3 * MiB)
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(body)
    lost = node_ids()[w[2]]
    remove(cluster4, lost)
    assert copies_identical(h, 3) == {"f": body}  # on the head, the one spare
    assert lost not in view(h)[0]


def test_a_node_that_joins_gets_the_missing_copy(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 4, w[0], named=(w[1], w[2], "head"))  # every node
    body = os.urandom(2 * MiB)
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(body)
    remove(cluster4, node_ids()[w[1]])
    live = set(node_ids().values())

    def counted() -> int:
        missing: int = ray.get(registry().missing_bytes.remote(live, h.key))
        return missing

    # No node to repair onto: one copy's worth short, counted, until a node joins.
    assert eventually(counted, "the missing copy counted") == 2 * MiB
    with fs.open_output_stream(f"{h.root}/g") as out:  # written while short
        out.write(b"while short")
    top_up(cluster4, 4)
    assert copies_identical(h, 4) == {"f": body, "g": b"while short"}
    live = set(node_ids().values())
    assert eventually(lambda: counted() == 0 or None, "nothing counted short") is True


def test_storage_node_removed_mid_report(cluster4: Cluster, tmp_path: Path) -> None:
    from ray.train import Checkpoint

    from air_transfer.train.hooks import download_directory, upload_directory
    from tests.support.checkpoints import digest_tree, make_checkpoint
    from tests.support.gates import Gate, HoldPackingAt, hold_packing

    w = workers()
    config = TransferConfig(chunk_bytes=MiB, window=2, strategy="chunked")
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],), config=config)
    src = make_checkpoint(tmp_path / "src", 4 * MiB)
    gate = Gate.options(**on("head")).remote()
    agent = node_agent(node_ids()["head"])  # packs this process's chunks
    hold_packing(agent, HoldPackingAt(2 * MiB, gate))
    try:
        stored: list[object] = []
        path = f"{h.root}/run/checkpoint_0"
        report = threading.Thread(
            target=lambda: stored.append(
                upload_directory(fs, path, Checkpoint.from_directory(str(src)), "worker")
            )
        )
        report.start()
        ray.get(gate.wait_for_arrivals.remote(1))  # half packed, copies writing
        remove(cluster4, node_ids()[w[0]])
        gate.open.remote()
        report.join(120)
    finally:
        hold_packing(agent, None)
    assert len(stored) == 1 and stored[0] is not None  # the report returned, stored
    assert download_directory(fs, path, str(tmp_path / "restored"))
    assert digest_tree(tmp_path / "restored") == digest_tree(src)
    copies = copies_identical(h, 2)
    assert {p: b for p, b in copies.items() if b is not None} == {
        f"run/checkpoint_0/{p}": b for p, b in tree(str(src)).items() if b is not None
    }
