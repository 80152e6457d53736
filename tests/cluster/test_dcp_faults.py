"""torch DCP through node storage (on the driver's node) when something dies: a rank
killed mid-save over an existing checkpoint leaves that checkpoint whole (never its
metadata over the new save's files) and its staging file is removed; the storage
node's agent killed during a read from another node is a ConnectionError (a plain
file read and a DCP load), and killed mid-save it is an error that says what died
and that the save can be made again, which it then can. Each fault lands at a known
point: a Gate the rank's planner or the storage agent's packing waits at."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
import torch
import torch.distributed.checkpoint as dcp
from ray.train import Checkpoint
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

import air_transfer
from air_transfer import TransferConfig
from air_transfer.cluster._ray_core import object_store_free_bytes
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import node_agent
from air_transfer.dcp import NodeStorageWriter
from air_transfer.dcp.train import _unwrapped
from air_transfer.storage.client.streams import read_chunk_bytes
from air_transfer.storage.node_api import NodeReads
from tests.support.checkpoints import kill_and_wait
from tests.support.cluster import node_ids
from tests.support.dcp_fns import MiB, Rank, free_port, pid, tensor, zeroed
from tests.support.gates import Gate
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.usefixtures("cluster"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]
CONFIG = TransferConfig(chunk_bytes=256 * 1024, window=4)
#: The item each rank's gated save stops before (its shard's upload open, its first
#: two tensors already sent).
GATED = "part2"


@pytest.fixture
def fs(tmp_path: Path) -> pafs.FileSystem:
    """Node storage on the driver's node, where no rank runs, rooted at the test's
    directory (made anew for each test: a test kills the storage agent, and a link
    to a dead agent fails once)."""
    return air_transfer.storage_filesystem(
        node=node_ids()["head"], config=CONFIG, root=str(tmp_path)
    )


@pytest.fixture
def rank_on() -> Iterator[Callable[[str], Any]]:
    """Makes a rank process on a node (resource name); all killed after the test."""
    made: list[Any] = []

    def make(node: str) -> Any:
        made.append(Rank.options(resources={node: 0.01}).remote())
        return made[-1]

    yield make
    for actor in made:
        ray.kill(actor)


def state(rank: int, version: int) -> dict[str, Any]:
    """Rank ``rank``'s 1 MiB of tensors in version ``version`` (the same layout in
    every version: a mix of two would load without an error)."""
    parts = {
        f"rank{rank}.part{i}": tensor(1000 * version + 10 * rank + i, (64, 1024)) for i in range(4)
    }
    return {**parts, "step": version}


class Gated(DefaultSavePlanner):
    """Waits at ``gate`` before it hands over the tensor ``GATED`` of its rank."""

    def __init__(self, gate: Any) -> None:
        super().__init__()
        self.gate = gate

    def resolve_data(self, write_item: Any) -> Any:
        if write_item.index.fqn.endswith(GATED):
            ray.get(self.gate.arrive_and_wait.remote())
        return super().resolve_data(write_item)


def save(rank: int, path: str, fs: pafs.FileSystem, version: int, gate: Any = None) -> str:
    """Save this rank's ``state`` (in the rank's process group, if it joined one);
    "saved", or what the save raised (as ``air_transfer.dcp.report`` raises it)."""
    planner = Gated(gate) if gate is not None else None
    writer = NodeStorageWriter(path, fs)
    try:
        _unwrapped(lambda: dcp.save(state(rank, version), storage_writer=writer, planner=planner))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "saved"


def loaded(path: str, fs: pafs.FileSystem, ranks: int) -> dict[str, Any]:
    """The whole checkpoint, loaded in this process (no process group)."""
    got = zeroed({k: v for r in range(ranks) for k, v in state(r, 0).items()})
    air_transfer.dcp.load(got, Checkpoint(path, filesystem=fs))
    return got


def is_version(got: dict[str, Any], ranks: int, version: int) -> bool:
    expected = {k: v for r in range(ranks) for k, v in state(r, version).items()}
    return got["step"] == version and all(
        torch.equal(got[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor)
    )


def staging(path: Path) -> list[str]:
    return [n for n in os.listdir(path) if ".air-upload-" in n]


def in_group(ranks: list[Any]) -> None:
    port = free_port()
    ray.get([r.join.remote(i, len(ranks), port) for i, r in enumerate(ranks)])


def test_a_rank_killed_mid_save_over_a_checkpoint_leaves_it_whole_and_no_staging(
    fs: pafs.FileSystem, rank_on: Callable[[str], Any], tmp_path: Path
) -> None:
    """Version 1 saved by two ranks; version 2 into the same directory, rank 1
    killed while its shard is half sent and after rank 0's shard is stored: the
    directory still loads version 1 whole (it loaded rank 0's tensors of version 2
    with rank 1's of version 1), and rank 1's hidden staging file is removed (it
    stayed for good). A save of version 3 then replaces version 1 and its files."""
    path, ranks = tmp_path / "ckpt", [rank_on("node_a"), rank_on("node_b")]
    in_group(ranks)
    assert ray.get([r.run.remote(save, i, str(path), fs, 1) for i, r in enumerate(ranks)]) == [
        "saved",
        "saved",
    ]
    v1_files = set(os.listdir(path))

    in_group(ranks)
    gate, killed = Gate.remote(), ray.get(ranks[1].run.remote(pid))
    v1_inodes = {n: os.stat(path / n).st_ino for n in v1_files}
    pending = [
        ranks[0].run.remote(save, 0, str(path), fs, 2),
        ranks[1].run.remote(save, 1, str(path), fs, 2, gate),  # stops with its shard half sent
    ]
    ray.get(gate.wait_for_arrivals.remote(1), timeout=60)
    eventually(
        lambda: any(
            n.startswith("__0_") and v1_inodes.get(n) != os.stat(path / n).st_ino
            for n in os.listdir(path)
            if n.endswith(".distcp")
        ),
        "rank 0's shard of version 2 to be stored",
    )
    assert len(staging(path)) == 1  # rank 1's
    kill_and_wait(ranks[1], killed)
    assert "saved" not in ray.get(pending[0], timeout=120)  # its peer died
    assert is_version(loaded(str(path), fs, 2), 2, 1)
    eventually(lambda: not staging(path), "the killed rank's staging file to be removed")
    ray.kill(gate)

    ranks = [ranks[0], rank_on("node_b")]
    in_group(ranks)
    assert ray.get([r.run.remote(save, i, str(path), fs, 3) for i, r in enumerate(ranks)]) == [
        "saved",
        "saved",
    ]
    assert is_version(loaded(str(path), fs, 2), 2, 3)
    assert not v1_files & set(os.listdir(path)) - {".metadata"}  # version 1's files went
    ray.get([r.leave.remote() for r in ranks])


def read_file(fs: pafs.FileSystem, path: str) -> None:
    """A byte range at the start, then the rest (as DCP reads a shard's items)."""
    with fs.open_input_file(path) as f:
        f.read_at(100, 0)
        f.read_at(f.size() - 100, 100)


def load_big(fs: pafs.FileSystem, path: str) -> None:
    got = {"w": torch.zeros(896, 1024), "step": 0}
    air_transfer.dcp.load(got, Checkpoint(path, filesystem=fs))


def read_paused(
    reader: Callable[[pafs.FileSystem, str], None], fs: pafs.FileSystem, path: str, gate: Any
) -> tuple[str, str]:
    """``reader(fs, path)``, stopped at ``gate`` once chunk 1 of the shard is fetched
    and verified: the refs of every chunk are at hand then (one batch), the fetches
    of those after 5 not started (a window of 4); what it raised."""
    import air_transfer.storage.client.streams as streams

    real = streams._verified

    def paused(link: Any, local: str, index: int, chunk: Any, checksum: Any) -> memoryview:
        view = real(link, local, index, chunk, checksum)
        if local.endswith(".distcp") and index == 1:
            ray.get(gate.arrive_and_wait.remote())
        return view

    streams._verified = paused
    try:
        reader(fs, path)
    except Exception as e:
        return type(e).__name__, str(e)
    finally:
        streams._verified = real
    return "no error", ""


def packed(path: str) -> None:
    """Have the storage agent pack every chunk of the file at ``path`` and keep them
    (its read cache, as for a reader), none of them moved off its node."""
    size = os.path.getsize(path)
    cb = read_chunk_bytes(CONFIG)
    count = -(-size // cb)
    agent = AgentClient(node_ids()["head"])
    call = agent.call(NodeReads.file_chunks, "/", path, size, cb, 0, count, CONFIG.cache_bytes)
    [pairs] = ray.get(call)
    ray.get([checksum for _, checksum in pairs])  # each one's packing is done
    del pairs


@pytest.mark.parametrize("reader", [read_file, load_big], ids=["file read", "DCP load"])
def test_the_storage_agent_killed_during_a_read_from_another_node_is_a_connection_error(
    fs: pafs.FileSystem,
    rank_on: Callable[[str], Any],
    tmp_path: Path,
    reader: Callable[[pafs.FileSystem, str], None],
) -> None:
    """A 3.5 MiB tensor's shard (8 chunks of 512 KiB, one batch of refs), read on
    node a, the storage agent having packed every chunk (``packed``); the reader
    stopped after chunk 1 while the agent is killed and its chunks freed: the chunks
    it fetches next had the dead agent for owner, and Ray's OwnerDiedError came
    through as it was."""
    path = str(tmp_path / "ckpt")
    big = {"w": tensor(5, (896, 1024)), "step": 1}
    dcp.save(big, storage_writer=NodeStorageWriter(path, fs), no_dist=True)
    target = f"{path}/__0_0.distcp" if reader is read_file else path
    packed(f"{path}/__0_0.distcp")
    a, gate = rank_on("node_a"), Gate.remote()
    pending = a.run.remote(read_paused, reader, fs, target, gate)
    ray.get(gate.wait_for_arrivals.remote(1), timeout=60)
    head = node_ids()["head"]
    agent, free = node_agent(head), object_store_free_bytes(head) or 0
    kill_and_wait(agent, ray.get(agent.pid.remote()))
    # The chunks die with their owner: none of those still to fetch is anywhere.
    eventually(
        lambda: (object_store_free_bytes(head) or 0) >= free + 3 * MiB,
        "the dead agent's chunks to be freed",
    )
    ray.get(gate.open.remote())
    kind, message = ray.get(pending, timeout=120)
    ray.kill(gate)
    assert kind == "ConnectionError", message
    assert node_ids()["head"] in message and "agent" in message, message


def test_the_storage_agent_killed_mid_save_says_what_died_and_the_save_can_be_made_again(
    fs: pafs.FileSystem, rank_on: Callable[[str], Any], tmp_path: Path
) -> None:
    """The rank on node a saves alone; the storage node's agent is killed while its
    shard is half sent: the save fails naming the agent and saying to save again
    (it failed with torch's "unexpected pos" error), nothing of it stays in storage,
    and the same save made again succeeds."""
    path, a = tmp_path / "ckpt", rank_on("node_a")
    agent, gate = node_agent(node_ids()["head"]), Gate.remote()
    pending = a.run.remote(save, 0, str(path), fs, 1, gate)
    ray.get(gate.wait_for_arrivals.remote(1), timeout=60)
    kill_and_wait(agent, ray.get(agent.pid.remote()))
    ray.get(gate.open.remote())
    error = ray.get(pending, timeout=120)
    ray.kill(gate)
    assert error.startswith("ConnectionError"), error
    assert node_ids()["head"] in error and "agent" in error, error
    assert "nothing of the DCP file" in error and "save it again" in error, error
    assert "unexpected pos" not in error
    eventually(lambda: not staging(path), "the failed upload's staging file to be removed")
    assert ".metadata" not in os.listdir(path)
    assert ray.get(a.run.remote(save, 0, str(path), fs, 1)) == "saved"
    assert is_version(loaded(str(path), fs, 1), 1, 1)
