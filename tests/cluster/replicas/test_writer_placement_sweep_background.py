"""``placement="writer"``: the replica registry sweeps orphan placed blobs itself. A
writer killed after its holders committed and before its stub leaves blobs that go
from every holder with no call by anyone, while a live writer's blobs in the same gap
and every committed file stay byte for byte (and the live writer then commits).

The writers are the sweep tests' ``GapWriter``; the registry here is one started with
its background sweep every second (the package's registry has it off)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster
from ray.exceptions import RayActorError

from air_transfer.cluster.liveness import dead
from air_transfer.core import environ
from air_transfer.storage.client.replica_set import registry
from air_transfer.storage.placed_record import SUMS_SUFFIX
from tests.cluster.replicas.test_writer_placement import SHARD, fs_of, placed
from tests.cluster.replicas.test_writer_placement_sweep import (
    gap_writer,
    named_files,
    placed_tree,
)
from tests.support.node_storage import read
from tests.support.replicas import top_up, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


def registry_with(sweep_s: str) -> None:
    """The replica registry started again with ``AIR_TRANSFER_PLACED_SWEEP_S`` set to
    ``sweep_s`` (its record outlives it: GCS); one started meanwhile by a process of
    other settings (a worker's) is stopped too."""
    os.environ[environ.PLACED_SWEEP_S] = sweep_s

    def started() -> bool:
        actor = registry()
        try:
            settings = ray.get(actor.identity.remote()).settings
        except RayActorError:
            return False  # the killed one, its name not freed yet
        if settings.get(environ.PLACED_SWEEP_S) != sweep_s:
            ray.kill(actor)
            return False
        return True

    eventually(started, f"a registry with {environ.PLACED_SWEEP_S}={sweep_s}")


@pytest.fixture
def sweeping_registry(replica_cluster: Cluster) -> Iterator[None]:
    """The registry with its background sweep every second, and the package's (off)
    again afterwards."""
    top_up(replica_cluster, 4)
    had = os.environ[environ.PLACED_SWEEP_S]
    registry_with("1")
    try:
        yield
    finally:
        registry_with(had)


def gone_from(tmp: Path, doomed: set[str]) -> bool:
    """Whether none of ``doomed`` is under the placed roots now."""
    try:
        return not doomed & set(placed_tree(tmp))
    except FileNotFoundError:  # removed by the sweep while it was walked: look again
        return False


def test_a_killed_writers_blobs_go_with_no_call(sweeping_registry: None, tmp_path: Path) -> None:
    h = placed(tmp_path, "head", named=(workers()[0],))
    kept = named_files(h, 3)
    fs = fs_of(h)
    alive, killed = gap_writer(workers()[2]), gap_writer(workers()[1])
    alive_data, orphan = os.urandom(SHARD), os.urandom(SHARD)
    alive_blob, _, _ = ray.get(alive.stage.remote(fs, f"{h.root}/ckpt/alive", alive_data))
    blob, process, pid = ray.get(killed.stage.remote(fs, f"{h.root}/ckpt/lost", orphan))
    before = placed_tree(tmp_path)
    doomed = {p for p in before if blob in p}
    assert sum(before[p] == orphan for p in doomed) == 2  # both holders committed it
    assert sum(p.endswith(SUMS_SUFFIX) for p in doomed) == 2  # and its checksums
    assert sum(before[p] == alive_data for p in before if alive_blob in p) == 2
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: dead({process}), "the killed writer known dead")
    eventually(
        lambda: gone_from(tmp_path, doomed),
        "the killed writer's blobs, checksums and markers swept with no call",
        timeout_s=60,
    )
    assert placed_tree(tmp_path) == {p: b for p, b in before.items() if p not in doomed}
    for path, data in kept.items():
        assert read(fs, path) == data
    ray.get(alive.finish.remote())  # its blobs were kept: its write commits whole
    assert read(fs, f"{h.root}/ckpt/alive") == alive_data
    assert not [p for p in placed_tree(tmp_path) if ".writer-" in p]  # no marker left
    for path, data in kept.items():
        assert read(fs, path) == data
    assert h.sweep_placed() == []  # nothing left for an operator either
    ray.kill(alive)
