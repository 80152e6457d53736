"""torch DCP through node storage on a mock cluster: ranks on the two non-driver
nodes save into the driver node's storage (gloo process groups, one actor per
rank), each rank's restore moves about its share of the bytes from the storage
node (its agent's counters), a checkpoint saved by 2 ranks loads into 1 and 3, and
a bad checkpoint read from another node raises a clear error with nothing loaded.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from ray.train import Checkpoint

import air_transfer
from air_transfer import ChecksumError, TransferConfig
from air_transfer.cluster.nodes import node_agent
from air_transfer.dcp import NodeStorageReader, NodeStorageWriter
from tests.support.cluster import node_ids, release_read_caches
from tests.support.dcp_fns import MiB, Rank, gang, owned, sharded_state, tensor, zeroed

pytestmark = [
    pytest.mark.usefixtures("cluster"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]
#: Node-storage reads then move 512 KiB chunks: small next to the ranks' shares.
CONFIG = TransferConfig(chunk_bytes=256 * 1024, window=4)


@pytest.fixture(scope="module")
def fs(tmp_path_factory: pytest.TempPathFactory) -> pafs.FileSystem:
    """Node storage on the driver's node, where no rank runs, rooted at the
    session's temporary directory."""
    return air_transfer.storage_filesystem(config=CONFIG, root=str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def ranks() -> Iterator[list[Any]]:
    """Three rank processes: on node a, node b, node a."""
    actors = [Rank.options(resources={n: 0.01}).remote() for n in ("node_a", "node_b", "node_a")]
    ids = node_ids()
    assert ray.get([a.node_id.remote() for a in actors]) == [
        ids["node_a"],
        ids["node_b"],
        ids["node_a"],
    ]
    yield actors
    for a in actors:
        ray.kill(a)


def served() -> int:
    """Bytes the storage node's agent has served to node-storage readers so far."""
    return int(ray.get(node_agent(node_ids()["head"]).read_counters.remote())["bytes_served"])


def save_sharded(rank: int, world: int, path: str, fs: pafs.FileSystem, mib: int) -> None:
    dcp.save(sharded_state(rank, mib), storage_writer=NodeStorageWriter(path, fs))


def load_own(rank: int, path: str, fs: pafs.FileSystem, mib: int) -> bool:
    """Rank ``rank``'s part alone (no process group): its tensors, the replicated
    one, the plain value; whether each came back exactly."""
    expected = sharded_state(rank, mib)
    state = zeroed(expected)
    air_transfer.dcp.load(state, Checkpoint(path, filesystem=fs))
    return state["step"] == 5 and all(
        torch.equal(state[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor)
    )


def test_each_rank_restores_only_its_share_of_a_sharded_checkpoint(
    ranks: list[Any], fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """Two ranks, each owning 8 MiB of tensors and both holding one replicated
    1 MiB tensor: DCP stores the replicated one once, each rank's file lands on the
    driver's node, and each rank's restore moves at most 1.2x the 9 MiB it needs
    (Ray's recipe downloads the whole 17 MiB checkpoint onto every node). The
    replicated tensor sits inside one rank's file: the other rank reads only its
    byte range."""
    path, mib = str(tmp_path / "ckpt"), 8
    gang(ranks[:2], save_sharded, path, fs, mib)
    files = {p.name: p.stat().st_size for p in (tmp_path / "ckpt").iterdir()}
    assert set(files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    total = sum(size for name, size in files.items() if name.endswith(".distcp"))
    assert 17 * MiB <= total < 17.1 * MiB, "the replicated tensor was not stored once"
    share = sum(t.nbytes for t in owned(0, mib).values()) + tensor(7, (256, 1024)).nbytes
    for rank, actor in enumerate(ranks[:2]):
        release_read_caches()
        before = served()
        assert ray.get(actor.run.remote(load_own, rank, path, fs, mib))
        moved = served() - before
        assert share <= moved <= 1.2 * share, f"rank {rank} moved {moved} bytes for {share}"


def save_dtensor(rank: int, world: int, path: str, fs: pafs.FileSystem) -> None:
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    full = tensor(11, (300, 512))  # rows split 150/150
    state = {"w": distribute_tensor(full, mesh, [Shard(0)]), "step": 9}
    dcp.save(state, storage_writer=NodeStorageWriter(path, fs))


def load_dtensor(rank: int, world: int, path: str, fs: pafs.FileSystem) -> bool:
    """Load into ``world`` ranks' shards (100 rows each for 3): this rank's rows."""
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    state = {"w": distribute_tensor(torch.zeros(300, 512), mesh, [Shard(0)]), "step": 0}
    dcp.load(state, storage_reader=NodeStorageReader(path, fs))
    rows = 300 // world
    expected = tensor(11, (300, 512))[rank * rows : (rank + 1) * rows]
    return state["step"] == 9 and torch.equal(state["w"].to_local(), expected)


def test_a_checkpoint_saved_by_two_ranks_loads_into_one_and_into_three(
    ranks: list[Any], fs: pafs.FileSystem, tmp_path: Path
) -> None:
    path = str(tmp_path / "ckpt")
    gang(ranks[:2], save_dtensor, path, fs)
    assert gang(ranks, load_dtensor, path, fs) == [True, True, True]
    # One process, no process group: the whole tensor, from both ranks' files.
    state = {"w": torch.zeros(300, 512), "step": 0}
    assert air_transfer.dcp.load(state, Checkpoint(path, filesystem=fs))
    assert state["step"] == 9 and torch.equal(state["w"], tensor(11, (300, 512)))


def load_altered(path: str, fs: pafs.FileSystem, mib: int) -> tuple[str, str, bool]:
    """Load rank 0's part with the second chunk arriving altered (its checksum
    does not match); the error and whether the state dict stayed as it was."""
    import air_transfer.storage.client.streams as streams

    real, calls = streams.chunk_checksum, []

    def altered(view: Any) -> str:
        calls.append(1)
        return "0" * 32 if len(calls) == 2 else real(view)

    state = zeroed(sharded_state(0, mib))
    streams.chunk_checksum = altered
    try:
        air_transfer.dcp.load(state, Checkpoint(path, filesystem=fs))
    except ChecksumError as e:
        untouched = all(not v.any() for v in state.values() if isinstance(v, torch.Tensor))
        return str(e.filename), str(e), untouched and state["step"] is None
    finally:
        streams.chunk_checksum = real
    return "", "no error", False


def load_bad(path: str, fs: pafs.FileSystem, mib: int) -> tuple[str, str, str, bool]:
    """Load rank 0's part of a bad checkpoint: the error's type, file and message,
    and whether the state dict stayed as it was."""
    state = zeroed(sharded_state(0, mib))
    try:
        air_transfer.dcp.load(state, Checkpoint(path, filesystem=fs))
    except OSError as e:
        untouched = all(not v.any() for v in state.values() if isinstance(v, torch.Tensor))
        return type(e).__name__, str(e.filename), str(e), untouched and state["step"] is None
    return "", "", "no error", False


def test_a_bad_checkpoint_read_from_another_node_is_an_error_and_nothing_is_loaded(
    ranks: list[Any], fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """Read on node a from the driver's node: a chunk altered in transit
    (ChecksumError naming the shard), a truncated shard, a missing metadata file,
    a path outside the storage root."""
    path, mib, a = str(tmp_path / "ckpt"), 2, ranks[0]
    gang(ranks[:2], save_sharded, path, fs, mib)
    shard = f"{path}/__0_0.distcp"
    filename, message, untouched = ray.get(a.run.remote(load_altered, path, fs, mib))
    assert filename == shard and "does not match the checksum" in message and untouched

    os.truncate(shard, os.path.getsize(shard) - 100)
    kind, filename, message, untouched = ray.get(a.run.remote(load_bad, path, fs, mib))
    assert (kind, filename) == ("OSError", shard) and "truncated DCP shard" in message
    assert untouched

    os.unlink(f"{path}/.metadata")
    kind, filename, message, untouched = ray.get(a.run.remote(load_bad, path, fs, mib))
    assert (kind, filename) == ("FileNotFoundError", f"{path}/.metadata") and untouched

    confined = air_transfer.storage_filesystem(config=CONFIG, root=str(tmp_path / "root"))
    kind, _, _, untouched = ray.get(a.run.remote(load_bad, path, confined, mib))
    assert kind == "PermissionError" and untouched


def fail_while_saving(path: str, fs: pafs.FileSystem) -> str:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class Failing(DefaultSavePlanner):
        def resolve_data(self, write_item: Any) -> Any:
            if write_item.index.fqn == "rank0.part2":
                raise RuntimeError("injected failure while writing")
            return super().resolve_data(write_item)

    try:
        dcp.save(
            sharded_state(0, 2),
            storage_writer=NodeStorageWriter(path, fs),
            planner=Failing(),
            no_dist=True,
        )
    except BaseException as e:
        return str(e)
    return "no error"


def test_a_save_that_fails_on_another_node_leaves_nothing_in_storage(
    ranks: list[Any], fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """The shard's upload, half sent from node a, is discarded: no file, not even
    its hidden staging file."""
    assert not dist.is_initialized()
    path = str(tmp_path / "ckpt")
    error = ray.get(ranks[0].run.remote(fail_while_saving, path, fs))
    assert "injected failure while writing" in error
    assert os.listdir(path) == []


def read_range(fs: pafs.FileSystem, path: str, ranges: list[tuple[int, int]]) -> list[bytes]:
    """Each ``(offset, length)`` of ``path``, read with one ``read_at`` on one open file."""
    with fs.open_input_file(path) as f:
        return [bytes(f.read_at(n, offset)) for offset, n in ranges]


def test_a_byte_range_read_fetches_only_the_chunks_that_hold_it(
    ranks: list[Any], fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """What DCP's restores rest on: a read after a seek moves the chunks of its
    range, not a window of chunks after them (a stream that goes on reading past
    them is read ahead again, as before)."""
    from air_transfer.storage.client.streams import read_chunk_bytes

    chunk = read_chunk_bytes(CONFIG)
    body = os.urandom(16 * chunk)
    (tmp_path / "f").write_bytes(body)
    path, a = str(tmp_path / "f"), ranks[0]
    cases = [
        ([(5 * chunk + 10, 100)], chunk),  # inside one chunk
        ([(5 * chunk - 10, 100)], 2 * chunk),  # across a boundary
        ([(chunk + 10, 100), (7 * chunk, 2 * chunk)], 3 * chunk),  # two, a gap between
        ([(0, len(body))], len(body)),  # the whole file
    ]
    for ranges, moved in cases:
        release_read_caches()
        before = served()
        got = ray.get(a.run.remote(read_range, fs, path, ranges))
        assert got == [body[o : o + n] for o, n in ranges]
        assert served() - before == moved, ranges
