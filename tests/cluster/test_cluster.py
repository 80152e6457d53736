"""Checkpoints packed on one node and rebuilt on another: every strategy, every way a
checkpoint travels, ownership, streaming larger than the store, spilling."""

from __future__ import annotations

import itertools
import os
import shutil
import signal
from pathlib import Path

import psutil
import pytest
import ray

from air_transfer import CheckpointLostError, ChunkedCheckpoint, TransferConfig
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import NAMESPACE, agent_name, node_agent, shutdown_agents
from air_transfer.cluster.transfer_leases import HeldTransfers
from tests.support.checkpoints import (
    Holder,
    MiB,
    Producer,
    PutWherePacked,
    consume_checkpoint,
    consume_ref,
    digest_tree,
    hand_over_then_hang,
    kill_and_wait,
    make_checkpoint,
    on,
)
from tests.support.cluster import STORE_BYTES, node_ids
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("cluster")
STRATEGIES = ["inline", "chunked", "streamed"]


def config_for(strategy: str | None, **kw: object) -> TransferConfig:
    return TransferConfig(chunk_bytes=MiB, window=8, strategy=strategy, **kw)


@pytest.fixture(scope="module")
def small_ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    root = make_checkpoint(tmp_path_factory.mktemp("small") / "ckpt", 5 * MiB)
    return root, digest_tree(root)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_way_across_nodes(
    tmp_path: Path, small_ckpt: tuple[Path, dict], strategy: str
) -> None:
    src, expected = small_ckpt
    ids = node_ids()
    producer = Producer.options(**on("node_a")).remote()
    assert ray.get(producer.node_id.remote()) == ids["node_a"]
    config = config_for(strategy)

    # 1. to_object_ref on node a -> from_object_ref on node b
    [ref] = ray.get(producer.share.remote(str(src), config))
    node, digests = ray.get(consume_ref.options(**on("node_b")).remote([ref], str(tmp_path / "1")))
    assert (node, digests) == (ids["node_b"], expected)

    # 2. a restored checkpoint as a plain task argument
    [restored] = ray.get(producer.share_restored.remote(str(src), config))
    assert restored.manifest.num_chunks == 6 and f"'{strategy}'" in repr(restored)
    node, digests = ray.get(
        consume_checkpoint.options(**on("node_b")).remote(restored, str(tmp_path / "2"))
    )
    assert (node, digests) == (ids["node_b"], expected)

    # 3. ray.put of a restored checkpoint, read on node b and on the driver (head)
    put_ref = ray.put(restored)
    node, digests = ray.get(
        consume_checkpoint.options(**on("node_b")).remote(put_ref, str(tmp_path / "3"))
    )
    assert (node, digests) == (ids["node_b"], expected)
    assert digest_tree(ray.get(put_ref).to_directory(tmp_path / "4")) == expected
    ray.kill(producer)


def test_caller_owned_chunks_die_with_their_worker(
    tmp_path: Path, small_ckpt: tuple[Path, dict]
) -> None:
    src, _ = small_ckpt
    producer = Producer.options(name="trainer-a", **on("node_a")).remote()
    [restored] = ray.get(producer.share_restored.remote(str(src), config_for("chunked")))
    kill_and_wait(producer)
    with pytest.raises(CheckpointLostError) as info:
        ray.get(consume_checkpoint.options(**on("node_b")).remote(restored, str(tmp_path / "o")))
    message = str(info.value)
    assert "actor trainer-a" in message and "owner='node'" in message
    assert not (tmp_path / "o").exists()


def test_node_owned_checkpoint_outlives_its_worker(
    tmp_path: Path, small_ckpt: tuple[Path, dict]
) -> None:
    src, expected = small_ckpt
    producer = Producer.options(**on("node_a")).remote()
    [ref] = ray.get(producer.share.remote(str(src), config_for("chunked", owner="node")))
    kill_and_wait(producer)  # the worker is gone ...
    _, digests = ray.get(consume_ref.options(**on("node_b")).remote([ref], str(tmp_path / "o")))
    assert digests == expected  # ... and its checkpoint still reads
    restored = ChunkedCheckpoint.from_object_ref(ref)
    assert f"actor {agent_name(node_ids()['node_a'])}" in restored._handle.owner
    # One agent per node, found by name, pinned to its node.
    agent = ray.get_actor(agent_name(node_ids()["node_a"]), namespace=NAMESPACE)
    assert ray.get(agent.node_id.remote()) == node_ids()["node_a"]


def test_shutdown_agents_makes_node_owned_checkpoints_unreadable(
    tmp_path: Path, small_ckpt: tuple[Path, dict]
) -> None:
    src, _ = small_ckpt
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(
            config=config_for("chunked", owner="node")
        )
    )
    assert shutdown_agents() >= 1
    # The store drops a dead owner's objects soon after: measured 1.7-4.5 s on a 2-core
    # machine, 30 to 220 reads; so a deadline, not a number of reads.
    attempts = itertools.count()

    def read_and_discard() -> bool:
        out = tmp_path / f"o{next(attempts)}"
        restored.to_directory(out)
        shutil.rmtree(out)
        return False  # until the read raises

    with pytest.raises(CheckpointLostError, match="air-transfer-agent"):
        eventually(read_and_discard, "node-owned chunks to become unreadable", 60)


@pytest.mark.parametrize("strategy", [*STRATEGIES, PutWherePacked.name])
def test_node_owned_checkpoint_outlives_a_worker_killed_after_handing_its_ref_on(
    tmp_path: Path, small_ckpt: tuple[Path, dict], strategy: str
) -> None:
    """A task packs with ``owner="node"``, hands the ref to an evaluator and is
    SIGKILLed: the checkpoint still reads on another node once the agent has counted
    the worker's refs as gone, with every strategy, a user's registered only in that
    worker included (and picked by its size rule). Defects: Ray learns of the
    holders a borrower passed a ref to only when it lets go of it
    (ray-project/ray#18456), so the agent freed the checkpoint under the evaluator;
    and the agent packed with its own registrations, not the worker's."""
    src, expected = small_ckpt
    user = strategy == PutWherePacked.name
    config = config_for(None if user else strategy, owner="node")
    holder = Holder.options(**on("node_b")).remote()
    hand_over_then_hang.options(**on("node_a")).remote(str(src), config, holder, user)
    eventually(lambda: ray.get(holder.giver.remote()) is not None, "the worker's hand-over", 120)
    pid = ray.get(holder.giver.remote())
    os.kill(pid, signal.SIGKILL)
    eventually(lambda: not psutil.pid_exists(pid), f"worker {pid} to exit")
    # The canary, borrowed from the agent the same way, is freed once the agent has
    # counted the dead worker's refs as gone: the checkpoint would have been by then.
    eventually(lambda: not ray.get(holder.canary_alive.remote()), "the agent freeing the canary")
    [ref] = ray.get(holder.refs.remote())
    node, digests = ray.get(consume_ref.options(**on("node_b")).remote([ref], str(tmp_path / "o")))
    assert (node, digests) == (node_ids()["node_b"], expected)
    assert ChunkedCheckpoint.from_object_ref(ref).handle().strategy.name == strategy
    ray.kill(holder)


def test_a_worker_that_lets_go_of_a_node_owned_checkpoint_ends_its_lease(
    tmp_path: Path, small_ckpt: tuple[Path, dict]
) -> None:
    """The agent's lease on a transfer lasts only while its requester references it:
    dropped once the driver lets go, and the checkpoint is then freed (the fixture
    checks the store), while a reader it was handed to before still reads it."""
    src, expected = small_ckpt
    agent = node_agent(node_ids()["head"])
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config_for("chunked", owner="node"))
    client = AgentClient(node_ids()["head"], agent)
    assert len(ray.get(client.call(HeldTransfers.leases))) == 1
    holder = Holder.options(**on("node_b")).remote()
    ray.get(holder.keep.remote([ref], [], os.getpid()))
    del ref
    eventually(
        lambda: not ray.get(client.call(HeldTransfers.leases)),
        "the lease to be dropped",
    )
    [ref] = ray.get(holder.refs.remote())
    _, digests = ray.get(consume_ref.options(**on("node_b")).remote([ref], str(tmp_path / "o")))
    assert digests == expected
    ray.kill(holder)


def test_streamed_checkpoint_larger_than_the_object_store(tmp_path: Path) -> None:
    # Twice the store of either node: what the next test shows spills when its
    # chunks are held at once; streamed must not.
    total = 2 * STORE_BYTES
    src = make_checkpoint(tmp_path / "big", total)
    expected = digest_tree(src)
    producer = Producer.options(**on("node_a")).remote()
    config = TransferConfig(chunk_bytes=8 * MiB, window=4)  # no strategy: auto-selected
    [restored] = ray.get(producer.share_restored.remote(str(src), config))
    assert restored._handle.strategy.name == "streamed"
    _, digests = ray.get(
        consume_checkpoint.options(**on("node_b")).remote(restored, str(tmp_path / "out"))
    )
    assert digests == expected
    assert not spilled(), "streaming must not spill"
    ray.kill(producer)


def test_streamed_source_that_changed_or_vanished(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", 4 * MiB)
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config=config_for("streamed"))
    )
    with open(src / "model.bin", "r+b") as f:  # same size, other bytes
        f.seek(2 * MiB)
        f.write(b"retrained")
    # The agent's fstat sees the file differ from its packing-time stamp before it
    # reads a byte of it (a checksum would only see chunk 2 differ).
    with pytest.raises(OSError, match=r"model\.bin' changed after the directory was scanned"):
        ray.get(consume_checkpoint.options(**on("node_b")).remote(restored, str(tmp_path / "o")))
    shutil.rmtree(src)
    with pytest.raises(OSError, match="vanished"):
        ray.get(consume_checkpoint.options(**on("node_b")).remote(restored, str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


def test_chunked_larger_than_the_object_store_spills_and_succeeds(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "big", 2 * STORE_BYTES)
    expected = digest_tree(src)
    producer = Producer.options(**on("node_a")).remote()
    config = TransferConfig(chunk_bytes=8 * MiB, window=4, strategy="chunked")
    [restored] = ray.get(producer.share_restored.remote(str(src), config))
    _, digests = ray.get(
        consume_checkpoint.options(**on("node_b")).remote(restored, str(tmp_path / "out"))
    )
    assert digests == expected
    assert spilled(), "a checkpoint twice the store size should have spilled"
    del restored
    ray.kill(producer)


def spilled() -> bool:
    """Whether any node of this cluster session has spilled objects to disk."""
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    return any(p.is_file() for d in session.glob("ray_spilled_objects*") for p in d.rglob("*"))
