"""torch DCP through node storage with a durable tier on a real S3 API (moto's server):
two ranks save a sharded checkpoint into the driver node's storage, it is drained
bit-identical, and once node storage no longer holds it (as on a new cluster) each
rank's load reads only the chunks of its own byte ranges from the bucket, each one
checked against the record the drain wrote, and gets its tensors back exactly."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
import torch
from ray.train import Checkpoint

import air_transfer
from air_transfer import StorageConfig, TransferConfig
from air_transfer.storage.durable import reads
from tests.support.cluster import node_ids
from tests.support.dcp_fns import Rank, gang, owned, sharded_state, tensor, zeroed
from tests.support.s3 import S3Server, bucket_server

pytestmark = [
    pytest.mark.usefixtures("cluster"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]
CHUNK = 256 * 1024


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "tier")


@pytest.fixture(scope="module")
def ranks() -> Iterator[list[Any]]:
    actors = [Rank.options(resources={n: 0.01}).remote() for n in ("node_a", "node_b")]
    yield actors
    for a in actors:
        ray.kill(a)


def save(rank: int, world: int, path: str, fs: pafs.FileSystem, mib: int) -> None:
    import torch.distributed.checkpoint as dcp

    from air_transfer.dcp import NodeStorageWriter

    dcp.save(sharded_state(rank, mib), storage_writer=NodeStorageWriter(path, fs))


def load_own(rank: int, path: str, fs: pafs.FileSystem, mib: int) -> tuple[bool, int]:
    """Rank ``rank``'s part alone; whether it came back exactly, and the bytes this
    process read from the durable tier meanwhile."""
    expected = sharded_state(rank, mib)
    state = zeroed(expected)
    before = reads.bytes_read()
    air_transfer.dcp.load(state, Checkpoint(path, filesystem=fs))
    exact = state["step"] == 5 and all(
        torch.equal(state[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor)
    )
    return exact, reads.bytes_read() - before


def test_each_rank_restores_its_share_from_the_durable_tier_alone(
    s3: S3Server, ranks: list[Any], tmp_path: Path
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    fs = air_transfer.storage_filesystem(
        node=node_ids()["head"],
        config=TransferConfig(chunk_bytes=CHUNK),
        root=str(root),
        storage=StorageConfig(durable=(s3.filesystem(), "tier/dcp")),
    )
    path, mib = str(root / "ckpt"), 8
    gang(ranks, save, path, fs, mib)
    air_transfer.wait_durable(fs, path, timeout=120)
    bucket: Any = s3.filesystem()
    for f in (root / "ckpt").iterdir():
        with bucket.open_input_stream(f"tier/dcp/ckpt/{f.name}") as got:
            assert got.read() == f.read_bytes(), f.name
        f.unlink()  # node storage loses it, as a new cluster's empty disks do
    (root / "ckpt").rmdir()
    share = sum(t.nbytes for t in owned(0, mib).values()) + tensor(7, (256, 1024)).nbytes
    for rank, actor in enumerate(ranks):
        exact, moved = ray.get(actor.run.remote(load_own, rank, path, fs, mib))
        assert exact, f"rank {rank} did not get its tensors back"
        assert share <= moved <= 1.2 * share, f"rank {rank} read {moved} bytes for {share}"
