"""The node holding a checkpoint's chunks (and their owner) disappears while a reader
on another node is halfway through. Its own cluster: each case removes a different
node for good (the reader stays on node_b)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from air_transfer import CheckpointLostError, TransferConfig
from tests.support.checkpoints import Consumer, MiB, Producer, make_checkpoint, on
from tests.support.cluster import node_ids, start_cluster
from tests.support.gates import Gate, gated

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


@pytest.fixture(scope="module")
def cluster() -> Iterator[object]:
    # A removed node is declared dead after 3 missed health checks 0.5 s apart, not
    # Ray's default 5 x 3 s: the tests wait for that each time.
    c = start_cluster(
        "node_a",
        "node_b",
        "node_c",
        "node_d",
        system_config={"health_check_period_ms": 500, "health_check_failure_threshold": 3},
    )
    yield c
    ray.shutdown()
    c.shutdown()


@pytest.mark.parametrize(
    ("strategy", "owner", "source_node"),
    [
        ("chunked", "caller", "node_a"),
        ("chunked", "node", "node_c"),
        ("streamed", "caller", "node_d"),
    ][:3],
)
def test_source_node_removed_mid_transfer(
    cluster: object, tmp_path: Path, strategy: str, owner: str, source_node: str
) -> None:
    src = make_checkpoint(tmp_path / "src", 8 * MiB)
    config = TransferConfig(chunk_bytes=MiB, window=2, strategy=strategy, owner=owner)
    producer = Producer.options(**on(source_node)).remote()
    [restored] = ray.get(producer.share_restored.remote(str(src), config))
    gate = Gate.options(**on("head")).remote()
    consumer = Consumer.options(**on("node_b")).remote()
    target = tmp_path / "out"
    pending = consumer.write.remote(gated(restored, gate), str(target))
    ray.get(gate.wait_for_arrivals.remote(1))

    doomed = next(n for n in cluster.worker_nodes if n.node_id == node_ids()[source_node])
    cluster.remove_node(doomed, allow_graceful=False)
    gate.open.remote()
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(pending, timeout=120)  # a hang would fail here, not block CI
    assert isinstance(info.value.cause, CheckpointLostError), info.value
    # Chained as __cause__ in the reading process; across the task boundary Ray keeps
    # only the message, which names the Ray error.
    assert re.search(
        r"\((OwnerDiedError|ObjectLostError|ActorDiedError|\w+Error)\)", str(info.value.cause)
    )
    assert not target.exists()
    assert [p for p in os.listdir(tmp_path) if ".air-staging-" in p] == []
    ray.kill(consumer)
