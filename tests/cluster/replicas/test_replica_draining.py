"""Replicated node storage when Ray says a node will go (the autoscaler scales it down,
the cloud preempts it: Ray's draining state, with a deadline): the copy on that node
is made again on a node that stays before the node goes, so K copies outlive the
departure, each bit-identical; and the drain into a durable tier never stays led by
the leaving copy. The drain is asked of Ray as the autoscaler asks it (the GCS's
``DrainNode``, reason preemption)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import ray
from ray.cluster_utils import Cluster

from air_transfer.storage.replica_wire import drain_leader
from tests.support.checkpoints import MiB
from tests.support.cluster import node_ids
from tests.support.replicas import remove, replicated, tree, view, workers
from tests.support.waiting import eventually


def _drain(node: str, seconds: float) -> None:
    """Tell Ray that ``node`` will go in ``seconds``, as a preemption notice does."""
    from ray.core.generated import autoscaler_pb2

    gcs = ray._private.worker.global_worker.gcs_client
    accepted, why = gcs.drain_node(
        node,
        autoscaler_pb2.DrainNodeReason.DRAIN_NODE_REASON_PREEMPTION,
        "a test preempts it",
        int((time.time() + seconds) * 1000),
    )
    assert accepted, why


def test_the_copy_on_a_node_that_will_go_is_made_elsewhere_before_it_goes(
    cluster4: Cluster, tmp_path: Path
) -> None:
    w = workers()
    ids = node_ids()
    fs, handler = replicated(tmp_path, 2, w[0], (w[1],))
    leaving = ids[w[1]]
    files = {f"ckpt/part-{i}.bin": os.urandom(MiB + i) for i in range(3)}
    fs.create_dir(f"{handler.root}/ckpt")
    for rel, data in files.items():
        with fs.open_output_stream(f"{handler.root}/{rel}") as out:
            out.write(data)
    before = view(handler)
    assert set(before[1]) == {ids[w[0]], leaving}
    _drain(leaving, 300)

    def made_elsewhere() -> dict[str, str] | None:
        copies, fresh, _ = view(handler)
        staying = [n for n in fresh if n != leaving]
        return {n: copies[n] for n in staying} if len(staying) >= 2 else None

    roots = eventually(made_elsewhere, lambda: f"a copy off {leaving[:12]}: {view(handler)}", 90)
    for root in roots.values():
        held = {rel: data for rel, data in tree(root).items() if data is not None}
        assert held == files  # bit-identical, every copy that stays
    assert drain_leader(view(handler)[1], handler.node_id, {leaving}) != leaving
    remove(cluster4, leaving)  # it goes: K copies outlived it, no repair needed
    fresh = view(handler)[1]
    assert len([n for n in fresh if n in node_ids().values()]) >= 2
    for rel, data in files.items():
        with fs.open_input_stream(f"{handler.root}/{rel}") as f:
            assert f.read() == data
