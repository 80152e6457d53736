"""``placement="writer"``: two repairs of one placed file (two users'
``repair_holders``, from processes on two nodes) never run at once. The first's swap
fails after its copy committed (a fault injected on both copies of the storage),
while the second is at the same new holder: the file ends with exactly K holders,
each holding every byte written, whatever order the race took. A repair killed
while it holds the file's claim does not block the next one.

The file's writer's holder is damaged on disk, so that both repairs copy from the
other holder to one new node (the next on the ring), and the registry's background
pass, which repairs only files short of live holders, stays out of it."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer.storage.client import replica_set
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.placed_sums import holder_problem
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.placed_record import SUMS_SUFFIX, PlacedRecord, placed_root
from air_transfer.storage.replica_wire import RegistryCalls
from tests.cluster.replicas.test_writer_placement import fs_of, placed
from tests.cluster.replicas.test_writer_placement_verify import flip, stored
from tests.support import agent_hooks
from tests.support.checkpoints import on
from tests.support.cluster import node_ids
from tests.support.gates import Gate
from tests.support.node_storage import read
from tests.support.replicas import top_up, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


@ray.remote(num_cpus=0)
class Repairer:
    """A user's process calling ``repair_holders``."""

    def pid(self) -> int:
        return os.getpid()

    def repair(self, fs: pafs.FileSystem, path: str) -> list[str] | str:
        """The files repaired, or the error that ended the repair."""
        handler = node_storage_handler(fs)
        assert isinstance(handler, WriterPlacedHandler)
        try:
            return handler.repair_holders(path)
        except Exception as e:
            return f"{type(e).__name__}: {e}"


def repairer(node: str) -> Any:
    return Repairer.options(**on(node)).remote()  # type: ignore[attr-defined]


def damaged_file(tmp: Path) -> tuple[WriterPlacedHandler, str, bytes, PlacedRecord]:
    """A placed file whose first holder (its writer's node) has a flipped byte."""
    h = placed(tmp, "head", named=(workers()[0],))
    path, data, record = stored(h, tmp)
    flip(record.where(record.holders[0]))
    return h, path, data, record


def new_holder(h: WriterPlacedHandler, record: PlacedRecord) -> str:
    """The node a repair copied ``record``'s blob to (none of its holders)."""
    named = dict(record.holders)
    found = [
        n
        for n in node_ids().values()
        if n not in named and Path(record.where((n, placed_root(h.replica_root, n)))).exists()
    ]
    assert len(found) == 1, found
    return found[0]


def claim_of(h: WriterPlacedHandler, record: PlacedRecord) -> tuple[str | None, int]:
    """The claim on ``record``'s blob in the registry, and how many others ask."""
    return replica_set.call(RegistryCalls.placed_claim, h.key, record.blob)


def whole(h: WriterPlacedHandler, path: str, data: bytes) -> None:
    """``path`` names exactly K holders, each with every byte written and its checksums."""
    after = h.record_of(path)
    assert after is not None
    assert len(after.holders) == h.replicas == len(dict(after.holders))
    for holder in after.holders:
        assert Path(after.where(holder)).read_bytes() == data, holder[0][:12]
        assert Path(after.where(holder) + SUMS_SUFFIX).exists()
        assert holder_problem(h, path, after, holder) is None
    assert read(fs_of(h), path) == data


def test_two_repairs_of_one_file_with_a_fault_leave_k_whole_holders(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h, path, data, record = damaged_file(tmp_path)
    ids = node_ids()
    copies = [ids["head"], ids[workers()[0]]]  # the storage's copies, where a swap runs
    swapped, summed = Gate.options(**on("head")).remote(), Gate.options(**on("head")).remote()
    for node in copies:  # the first swap fails on both, after its copy committed
        agent_hooks.hold(node, "_uploads", "fs_swap_stub", swapped, match="/d/f", fail=True)
    hooked = list(copies)
    try:
        first, second = repairer(workers()[1]), repairer(workers()[2])
        failing = first.repair.remote(fs_of(h), path)
        ray.get(swapped.wait_for_arrivals.remote(2))
        target = new_holder(h, record)
        # The second repair's checksums at the same new holder wait, if it gets there
        # before the first one's failure is handled.
        sums = f"{record.blob}{SUMS_SUFFIX}"
        agent_hooks.hold(target, "_uploads", "fs_commit", summed, match=sums)
        hooked.append(target)
        at_target = summed.wait_for_arrivals.remote(1)
        later = second.repair.remote(fs_of(h), path)
        eventually(
            lambda: ray.wait([at_target], timeout=0)[0] or claim_of(h, record)[1] >= 1,
            "the second repair at the new holder, or waiting for the first",
        )
        swapped.open.remote()
        assert "injected fault of fs_swap_stub" in str(ray.get(failing))
        summed.open.remote()
        assert ray.get(later) == [path]
    finally:
        ray.get([g.open.remote() for g in (swapped, summed)])
        for node in copies:
            agent_hooks.release(node, "_uploads", "fs_swap_stub")
        for node in hooked[len(copies) :]:
            agent_hooks.release(node, "_uploads", "fs_commit")
    whole(h, path, data)
    assert claim_of(h, record) == (None, 0)
    assert h.repair_holders(h.root) == []


def test_a_repair_killed_holding_the_claim_does_not_block_the_next(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    top_up(replica_cluster, 4)
    h, path, data, record = damaged_file(tmp_path)
    gate = Gate.options(**on("head")).remote()
    sums = f"{record.blob}{SUMS_SUFFIX}"
    nodes = list(node_ids().values())
    for node in nodes:  # only the new holder is sent checksums: its first commit waits
        agent_hooks.hold(node, "_uploads", "fs_commit", gate, match=sums)
    try:
        killed = repairer(workers()[1])
        pid = ray.get(killed.pid.remote())
        killed.repair.remote(fs_of(h), path)
        ray.get(gate.wait_for_arrivals.remote(1))  # its copy committed, it holds the claim
        assert claim_of(h, record)[0] is not None
        os.kill(pid, signal.SIGKILL)
        assert ray.get(repairer(workers()[2]).repair.remote(fs_of(h), path)) == [path]
    finally:
        ray.get(gate.open.remote())
        for node in nodes:
            agent_hooks.release(node, "_uploads", "fs_commit")
    whole(h, path, data)
    assert claim_of(h, record)[0] is None
