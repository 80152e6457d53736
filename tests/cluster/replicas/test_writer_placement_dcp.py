"""torch DCP into ``placement="writer"`` node storage: each rank's shard file stays on
the rank's node (and one other), and a rank restoring its own share reads it from
its own disk: no agent serves it a byte of its own tensors."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
import torch
import torch.distributed.checkpoint as dcp
from ray.cluster_utils import Cluster
from ray.train import Checkpoint

import air_transfer
from air_transfer import TransferConfig
from air_transfer.cluster.nodes import node_agent
from air_transfer.dcp import NodeStorageWriter
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from tests.support.cluster import node_ids
from tests.support.dcp_fns import MiB, Rank, gang, sharded_state, tensor, zeroed
from tests.support.replicas import top_up, workers

pytestmark = [
    pytest.mark.own_ray,  # a Ray of its own (tests/conftest.py: the order)
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]
#: Reads move 256 KiB chunks: small next to the ranks' shares.
CONFIG = TransferConfig(chunk_bytes=256 * 1024, window=4)
#: Each rank's own tensors, in MiB.
MIB = 4


@pytest.fixture(scope="module")
def ranks(replica_cluster: Cluster) -> Iterator[list[Any]]:
    """Two rank processes, on the first two live worker nodes (the package's tests
    remove nodes for good and add others)."""
    top_up(replica_cluster, 4)
    names = workers()[:2]
    actors = [Rank.options(resources={n: 0.01}).remote() for n in names]
    ids = node_ids()
    got = ray.get([a.node_id.remote() for a in actors], timeout=120)
    assert got == [ids[n] for n in names]
    yield actors
    for a in actors:
        ray.kill(a)


def served() -> int:
    """Bytes every node's agent has served to node-storage readers so far."""
    counters = ray.get([node_agent(n).read_counters.remote() for n in node_ids().values()])
    return sum(int(c["bytes_served"]) for c in counters)


def save(rank: int, world: int, path: str, fs: pafs.FileSystem) -> None:
    dcp.save(sharded_state(rank, MIB), storage_writer=NodeStorageWriter(path, fs))


def load_own(rank: int, path: str, fs: pafs.FileSystem) -> bool:
    """Rank ``rank``'s part alone: whether each of its tensors came back exactly."""
    expected = sharded_state(rank, MIB)
    state = zeroed(expected)
    air_transfer.dcp.load(state, Checkpoint(path, filesystem=fs))
    return state["step"] == 5 and all(
        torch.equal(state[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor)
    )


def test_each_rank_restores_its_shard_from_its_own_disk(ranks: list[Any], tmp_path: Path) -> None:
    ids = node_ids()
    fs = air_transfer.storage_filesystem(
        node=ids["head"],
        config=CONFIG,
        root=str(tmp_path / "copies" / ids["head"]),
        replicas=2,
        replica_root=str(tmp_path / "copies" / "{node_id}"),
        placement="writer",
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, WriterPlacedHandler)
    path = f"{handler.root}/ckpt"
    gang(ranks, save, path, fs)
    nodes = ray.get([a.node_id.remote() for a in ranks])
    for rank, node in enumerate(nodes):
        record = handler.record_of(f"{path}/__{rank}_0.distcp")
        assert record is not None and record.holders[0][0] == node, rank
    metadata = fs.get_file_info(f"{path}/.metadata").size or 0
    replicated = tensor(7, (256, 1024)).nbytes  # in one rank's file: the other reads it
    before = served()
    for rank, actor in enumerate(ranks):
        assert ray.get(actor.run.remote(load_own, rank, path, fs))
    moved = served() - before
    # Each rank's own 4 MiB came from its own disk: what agents served is the
    # metadata, the replicated tensor's range and the chunks around them.
    assert moved <= 2 * metadata + replicated + 4 * CONFIG.chunk_bytes, moved
    assert moved < 4 * MiB
