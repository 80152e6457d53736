"""The replica registry's actor dies: the copy that missed a write and a delete is
stale in the record it saved, so the registry the next caller starts never lets it
be read and repairs it; a write whose registry died between its start and its close
goes on with the new one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer import node_agent
from air_transfer.storage.client.replica_set import registry
from air_transfer.storage.server.replica_host import GcsStore
from air_transfer.storage.server.replica_record import Replicated
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.replicas import copies_identical, read_local, replicated, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


def test_a_registry_started_again_never_serves_a_stale_copy(
    cluster4: Cluster, tmp_path: Path
) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    replica = node_ids()[w[1]]
    ray.get(registry().stop_repair.remote())  # the copy stays stale while this one lives
    for name in ("f", "g"):
        with fs.open_output_stream(f"{h.root}/{name}") as out:
            out.write(b"v1" * MiB)
    with fs.open_output_stream(f"{h.root}/f") as out:  # the replica's agent dies mid-write
        out.write(b"v2" * MiB)
        ray.kill(node_agent(replica))
        out.write(b"v2" * MiB)
    fs.delete_file(f"{h.root}/g")  # missed too: the replica is no target now
    ray.kill(registry())
    saved = Replicated.from_record(GcsStore().load_all()[h.key])
    assert saved.fresh == {node_ids()[w[0]]}  # what the next registry starts from
    # A reader on the stale copy's node (which prefers its own disk) starts the next
    # registry, and reads the fresh copy's bytes.
    assert ray.get(read_local.options(**on(w[1])).remote(fs, f"{h.root}/f")) == b"v2" * 2 * MiB
    assert ray.get(read_local.options(**on(w[1])).remote(fs, f"{h.root}/g")) is None

    body = os.urandom(MiB + 1)
    with fs.open_output_stream(f"{h.root}/h") as out:
        out.write(body)
        ray.kill(registry())  # its close asks the one started in its place
    assert read(fs, f"{h.root}/h") == body
    # Repaired by the new registry: the delete included, nothing staged left.
    assert copies_identical(h, 2) == {"f": b"v2" * 2 * MiB, "h": body}
