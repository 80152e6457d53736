"""Fan-out of a ``streamed`` checkpoint (one larger than the storage node's object
store) restored from node storage on ``node_a`` by readers on two nodes at once: the
storage node streams it once, to a feed on the first reader's node that both readers
read in lockstep (``transfer.relay_stream``); a feed lost mid-read is read again from
the storage node; and, on the relay node's agent itself, a reader that joins late
reads what the feed has passed from a stream of its own, a stuck reader is dropped
after its stall time, and readers over the feed's share are refused."""

from __future__ import annotations

import itertools
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import node_agent
from air_transfer.config import TransferConfig
from air_transfer.errors import CheckpointLostError
from air_transfer.transfer.relay_stream import Bounds, StreamRelays
from tests.support.checkpoints import MiB, digest_tree, kill_and_wait, on
from tests.support.cluster import node_ids
from tests.support.fanout import grown, holding, tree_size
from tests.support.node_storage import CONFIG, read_counters
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("cluster")

STREAMED = CONFIG.replace(strategy="streamed")
SIZE = 24 * MiB  # 25 chunks of 1 MiB: more than a feed keeps on a 128 MiB store (19)


def test_readers_on_two_nodes_share_one_stream_from_the_storage_node(tmp_path: Path) -> None:
    """Defect: each reader of a ``streamed`` checkpoint had the storage node read and
    push it once (4 readers of 0.6 GB with 600 MiB stores: 4.00x). The first
    reader's node now feeds it, once, to its own reader and to the other's."""
    with holding(tmp_path, SIZE, STREAMED) as state:
        ray.get(state["gate"].open.remote())
        assert ray.get(state["readers"], timeout=180) == [digest_tree(state["src"])] * 2
    size, before = tree_size(state["src"]), state["before"]
    assert grown("node_a", "bytes_streamed", before) == size  # one stream, not two
    assert grown("node_a", "transfers_relayed", before) == 1
    assert grown("node_b", "feed_bytes_fed", before) == size
    assert grown("node_b", "feed_bytes_joined", before) == 0
    assert grown("node_b", "feed_bytes_served", before) == 2 * size
    relay = AgentClient(node_ids()["node_b"])
    eventually(lambda: ray.get(relay.call(StreamRelays.relay_feeds)) == 0, "the feed to go", 60)


def test_a_feed_lost_mid_read_is_read_again_from_the_storage_node(tmp_path: Path) -> None:
    """The feed's node's agent killed mid-read: both readers, the one on its node
    too, read the transfer itself, and get the source's bytes."""
    with holding(tmp_path, SIZE, STREAMED) as state:
        agent = node_agent(node_ids()["node_b"])
        kill_and_wait(agent, ray.get(agent.pid.remote()))
        ray.get(state["gate"].open.remote())
        assert ray.get(state["readers"], timeout=180) == [digest_tree(state["src"])] * 2
    assert grown("node_a", "bytes_served", state["before"]) == 4 * tree_size(state["src"])


@pytest.fixture(scope="module")
def streamed() -> Iterator[tuple[Any, list[bytes]]]:
    """A ``streamed`` transfer of 8 chunks of 1 MiB packed on the driver's node, and
    the chunks' bytes."""
    with tempfile.TemporaryDirectory() as tmp:
        chunks = [bytes([i]) * MiB for i in range(8)]
        (Path(tmp) / "model.bin").write_bytes(b"".join(chunks))
        config = TransferConfig(strategy="streamed", chunk_bytes=MiB, window=1)
        checkpoint = ray.get(ChunkedCheckpoint.from_directory(tmp).to_object_ref(config=config))
        yield checkpoint.handle(), chunks


def _stream(handle: Any, bounds: Bounds, reader_node: str, key: str, start: int = 0) -> Any:
    relay = AgentClient(node_ids()["node_b"])
    n = handle.manifest.num_chunks
    return relay.stream(1, StreamRelays.relayed_stream, key, handle, start, n, bounds, reader_node)


@ray.remote(num_cpus=0)
class Reader:
    """A reader of a feed in a process of its own, as each restore is: it reads as
    many chunks as it is told, when it is told."""

    def __init__(self, handle: Any, bounds: Bounds, key: str) -> None:
        self._handle, self._bounds, self._key = handle, bounds, key
        self._refs: Any = None

    def read(self, count: int | None = None) -> list[bytes]:
        if self._refs is None:  # asks when told to, not when its process is up
            node = f"elsewhere-{uuid.uuid4().hex}"
            self._refs = _stream(self._handle, self._bounds, node, self._key)
        taken = itertools.islice(self._refs, count)
        return [bytes(ray.get(ref)) for ref in taken]


def test_a_late_reader_reads_what_the_feed_passed_from_a_stream_of_its_own(
    streamed: tuple[Any, list[bytes]],
) -> None:
    """A reader that asks once the feed has dropped its first chunks joins it at
    its lowest chunk kept and reads those before from a stream of its own; the
    first reader then moves in step with it, and both get every chunk."""
    handle, chunks = streamed
    key, bounds = f"late-{uuid.uuid4().hex}", Bounds(2, 4, 60.0)
    before = read_counters("node_b")
    first = Reader.options(**on("head")).remote(handle, bounds, key)
    late = Reader.options(**on("head")).remote(handle, bounds, key)
    try:
        # The first reads 5 chunks and is held there (one chunk ahead at most): the
        # feed has dropped chunk 0 when the late one asks; then both read at once.
        got = ray.get(first.read.remote(5))
        got_late = ray.get(late.read.remote(1))
        both = [late.read.remote(), first.read.remote()]
        assert ray.get(both, timeout=120) == [chunks[1:], chunks[5:]]
        assert got == chunks[:5] and got_late == chunks[:1]
    finally:
        for reader in (first, late):
            ray.kill(reader)
    after = read_counters("node_b")
    joined = after["feed_bytes_joined"] - before["feed_bytes_joined"]
    assert MiB <= joined < len(chunks) * MiB
    assert after["feed_bytes_fed"] - before["feed_bytes_fed"] == len(chunks) * MiB


def test_a_stuck_reader_is_dropped_after_its_stall_time(
    streamed: tuple[Any, list[bytes]],
) -> None:
    """A reader that stops reading holds the others up to its stall time, then is
    dropped with CheckpointLostError (it then reads the transfer itself) while the
    others read on to the end."""
    handle, chunks = streamed
    key, bounds = f"stuck-{uuid.uuid4().hex}", Bounds(2, 4, 1.0)
    before = read_counters("node_b")
    stuck = _stream(handle, bounds, "elsewhere", key)
    assert bytes(ray.get(next(stuck))) == chunks[0]
    moving = _stream(handle, bounds, "elsewhere-2", key)
    assert [bytes(ray.get(ref)) for ref in moving] == chunks
    with pytest.raises(ray.exceptions.RayTaskError) as dropped:
        for ref in stuck:
            ray.get(ref)
    assert isinstance(dropped.value.cause, CheckpointLostError)
    assert "held its other readers up for 1 s" in str(dropped.value.cause)
    assert read_counters("node_b")["feed_streams_dropped"] - before["feed_streams_dropped"] == 1


def test_a_feed_refuses_a_reader_over_its_share_but_not_its_own_nodes(
    streamed: tuple[Any, list[bytes]],
) -> None:
    """A feed streams to at most ``max_streams`` readers on other nodes at once: one
    more is refused before any chunk, with CheckpointLostError (its reader then
    reads the transfer itself); a reader on the feed's own node is not counted."""
    handle, chunks = streamed
    key, bounds = f"share-{uuid.uuid4().hex}", Bounds(8, 1, 60.0)  # keeps every chunk
    first = _stream(handle, bounds, "elsewhere", key)
    assert bytes(ray.get(next(first))) == chunks[0]
    refused = _stream(handle, bounds, "elsewhere-2", key)
    with pytest.raises(ray.exceptions.RayTaskError) as over:
        ray.get(next(refused))
    assert isinstance(over.value.cause, CheckpointLostError)
    assert "already streams to 1 readers on other nodes" in str(over.value.cause)
    local = _stream(handle, bounds, node_ids()["node_b"], key)
    assert [bytes(ray.get(ref)) for ref in local] == chunks
    assert [bytes(ray.get(ref)) for ref in first] == chunks[1:]
    relay = AgentClient(node_ids()["node_b"])
    eventually(lambda: ray.get(relay.call(StreamRelays.relay_feeds)) == 0, "the feed to go", 60)
