"""Fan-out of Ray Train's restores from node storage on ``node_a``: a restore on one
node while a restore on another node reads the same checkpoint is served from a
relay, copies of its chunks made once on the first reader's node (so the storage
node pushes the checkpoint about once, not once per node); every reader gets the
source's bytes, and a relay lost mid-read is read again from the storage node."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray

from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import node_agent
from air_transfer.errors import CheckpointLostError
from air_transfer.transfer.fanout import WINDOW_SHARE
from air_transfer.transfer.relay_window import RelayWindows
from tests.support.checkpoints import MiB, digest_tree, kill_and_wait
from tests.support.cluster import STORE_BYTES, node_ids
from tests.support.fanout import grown, holding, tree_size
from tests.support.node_storage import CONFIG, read_counters
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("cluster")


@pytest.fixture
def held(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """``holding`` a checkpoint of 6 MiB (7 chunks)."""
    with holding(tmp_path, 6 * MiB, CONFIG) as state:
        yield state


def test_a_second_node_reads_a_relay_made_once_on_the_first_readers_node(
    held: dict[str, Any],
) -> None:
    """Defect: 4 restores at once of a 256 MiB checkpoint made the storage node push
    it 3.4-4.0 times (Ray pulls a chunk from a node picked among those holding it
    when the pull starts: readers in step find the storage node alone). A reader on
    another node now reads a relay: each chunk copied once on the first reader's
    node, from the chunk that node pulls for its own reader anyway."""
    src, before = held["src"], held["before"]
    ray.get(held["gate"].open.remote())
    assert ray.get(held["readers"], timeout=120) == [digest_tree(src)] * 2
    storage, relay = read_counters("node_a"), read_counters("node_b")
    assert storage["transfers_packed"] - before["node_a"]["transfers_packed"] == 1
    assert storage["bytes_read"] - before["node_a"]["bytes_read"] == tree_size(src)
    assert storage["transfers_relayed"] - before["node_a"]["transfers_relayed"] == 1
    assert relay["bytes_relayed"] - before["node_b"]["bytes_relayed"] == tree_size(src)
    assert storage["transfer_readers"] == 0


def test_a_relay_lost_mid_read_is_read_again_from_the_storage_node(
    held: dict[str, Any],
) -> None:
    """The relay's copies are made by the agent of the first reader's node: killed
    while it still has chunks to copy, the second reader reads the transfer itself."""
    agent = node_agent(node_ids()["node_b"])
    kill_and_wait(agent, ray.get(agent.pid.remote()))
    ray.get(held["gate"].open.remote())
    assert ray.get(held["readers"], timeout=120) == [digest_tree(held["src"])] * 2
    served = read_counters("node_a")["bytes_served"] - held["before"]["node_a"]["bytes_served"]
    assert served == 3 * tree_size(held["src"])  # the second reader asked again


def test_the_relay_outlives_the_reader_on_its_node(held: dict[str, Any]) -> None:
    """The copies are made by the relay node's agent, not by the reader there: that
    reader killed mid-read, the other still reads the relay to the end."""
    first, second = held["readers"]
    ray.cancel(first, force=True)
    with pytest.raises(ray.exceptions.RayError):
        ray.get(first, timeout=60)
    ray.get(held["gate"].open.remote())
    assert ray.get(second, timeout=120) == digest_tree(held["src"])
    served = read_counters("node_a")["bytes_served"] - held["before"]["node_a"]["bytes_served"]
    assert served == 2 * tree_size(held["src"])  # the relay, read to the end: no second ask
    assert read_counters("node_b")["bytes_relayed"] - held["before"]["node_b"]["bytes_relayed"] == (
        tree_size(held["src"])
    )


def test_a_checkpoint_over_half_the_relay_nodes_store_is_relayed_through_a_window(
    tmp_path: Path,
) -> None:
    """Defect: a checkpoint over half the first reader's node's object store was not
    relayed, so every reader pulled it from the storage node (N readers: N pushes).
    Its relay is now a window on that node: the second reader streams the chunks from
    the relay node's agent, which pulls each once and keeps at most ``WINDOW_SHARE``
    of its store of them, so the relay never fills that store."""
    with holding(tmp_path, STORE_BYTES // 2 + 8 * MiB, CONFIG) as state:
        ray.get(state["gate"].open.remote())
        assert ray.get(state["readers"], timeout=180) == [digest_tree(state["src"])] * 2
    size, before = tree_size(state["src"]), state["before"]
    assert grown("node_a", "transfers_relayed", before) == 1
    assert grown("node_a", "bytes_served", before) == 2 * size  # no reader asked again
    assert grown("node_b", "window_bytes_pulled", before) == size  # each chunk once
    assert grown("node_b", "window_bytes_served", before) == size
    assert grown("node_b", "bytes_relayed", before) == 0  # no copies of the whole
    assert 0 < read_counters("node_b")["window_peak_bytes"] <= STORE_BYTES * WINDOW_SHARE
    relay_agent = AgentClient(node_ids()["node_b"])
    eventually(lambda: ray.get(relay_agent.call(RelayWindows.relay_windows)) == 0, "window", 60)


def test_a_windowed_relay_lost_mid_read_is_read_again_from_the_storage_node(
    tmp_path: Path,
) -> None:
    """The relay node's agent killed while it streams the window to the second
    reader (its first chunks served, the rest not packed yet): that reader reads the
    transfer itself, and gets the source's bytes."""
    with holding(tmp_path, STORE_BYTES // 2 + 8 * MiB, CONFIG) as state:
        before = state["before"]
        eventually(lambda: grown("node_b", "window_bytes_served", before) >= MiB, "mid-read", 60)
        agent = node_agent(node_ids()["node_b"])
        kill_and_wait(agent, ray.get(agent.pid.remote()))
        ray.get(state["gate"].open.remote())
        assert ray.get(state["readers"], timeout=180) == [digest_tree(state["src"])] * 2
    assert grown("node_a", "bytes_served", before) == 3 * tree_size(state["src"])  # asked again


def test_a_windowed_relays_reader_killed_mid_read_closes_its_window(tmp_path: Path) -> None:
    """The relay's reader cancelled while it streams the window: the relay node's
    agent ends that stream and lets go of the window (no chunk left pinned there),
    and the reader on the relay node still reads the transfer to the end."""
    relay_agent = AgentClient(node_ids()["node_b"])
    with holding(tmp_path, STORE_BYTES // 2 + 8 * MiB, CONFIG) as state:
        before = state["before"]
        eventually(lambda: grown("node_b", "window_bytes_served", before) >= MiB, "mid-read", 60)
        first, second = state["readers"]
        ray.cancel(second, force=True)
        with pytest.raises(ray.exceptions.RayError):
            ray.get(second, timeout=60)
        ray.get(state["gate"].open.remote())
        assert ray.get(first, timeout=180) == digest_tree(state["src"])
    eventually(lambda: ray.get(relay_agent.call(RelayWindows.relay_windows)) == 0, "window", 60)


def test_a_window_refuses_a_stream_over_its_share_of_the_store() -> None:
    """A relay node's agent streams a window to at most ``max_streams`` readers at
    once (their chunks in flight within the relay's share of its store): one more
    is refused before any chunk, with CheckpointLostError (its reader then reads the
    transfer from the node that packed it), and the window closes after the first."""
    relay = AgentClient(node_ids()["node_b"])
    chunks = [ray.put(np.full(MiB, i, dtype=np.uint8)) for i in range(4)]
    key = f"refusal-{uuid.uuid4().hex}"
    first = relay.stream(1, RelayWindows.relayed_chunks, key, chunks, 0, 4 * MiB, 1, 1)
    assert ray.get(next(first))[0] == 0  # the first stream runs: one chunk read, more held
    second = relay.stream(1, RelayWindows.relayed_chunks, key, chunks, 0, 4 * MiB, 1, 1)
    with pytest.raises(ray.exceptions.RayTaskError) as refused:
        ray.get(next(second))
    assert isinstance(refused.value.cause, CheckpointLostError)
    assert "already streams to 1 readers" in str(refused.value.cause)
    assert [ray.get(ref)[0] for ref in first] == [1, 2, 3]
    eventually(lambda: ray.get(relay.call(RelayWindows.relay_windows)) == 0, "window", 60)
