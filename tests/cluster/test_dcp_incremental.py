"""Incremental torch DCP saves on the mock cluster: a rank on ``node_a`` saves
(``no_dist``, one process) into incremental node storage on the driver's node, and a
save sends only the chunks of its shard that no earlier save under the root holds
(the storage agent's ``incremental_counters``, against what the stored files say
changed); 0%, ~90% and 100% unchanged; a save from the storage node itself storing
an unchanged shard once (and two such writers at once); a corrupted stored chunk
sent again; deleting the older save; two saves sharing a base at once; a failed
save, a writer dying with chunks in flight, and the storage agent dying mid-stream,
leaving nothing. Every save restores bit-identical."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray
import torch
import torch.distributed.checkpoint as dcp
from ray.train import Checkpoint

import air_transfer
from air_transfer import TransferConfig
from air_transfer.cluster.nodes import node_agent
from air_transfer.core.checksum import chunk_checksum
from air_transfer.dcp import NodeStorageWriter
from tests.support.checkpoints import kill_and_wait
from tests.support.cluster import node_ids
from tests.support.dcp_fns import Rank, tensor
from tests.support.waiting import eventually

pytestmark = [
    pytest.mark.usefixtures("cluster"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]
CHUNK = 128 * 1024
CONFIG = TransferConfig(chunk_bytes=CHUNK, window=4, incremental=True)


@pytest.fixture(scope="module")
def rank() -> Iterator[Any]:
    """One process on node a, running up to two saves at once."""
    actor = Rank.options(resources={"node_a": 0.01}, max_concurrency=2).remote()
    assert ray.get(actor.node_id.remote()) == node_ids()["node_a"]
    yield actor
    ray.kill(actor)


@pytest.fixture
def fs(tmp_path: Path) -> pafs.FileSystem:
    """Incremental node storage on the driver's node, its own root (and index)."""
    return air_transfer.storage_filesystem(
        node=node_ids()["head"], config=CONFIG, root=str(tmp_path)
    )


def state(frozen: int, head: int) -> dict[str, Any]:
    """A 4 MiB frozen tensor, a 192 KiB trained one and the step: ~90% unchanged
    between two saves with the same ``frozen`` seed; the shard's tail is over a
    quarter of a chunk, so it is asked about as a chunk is."""
    return {"frozen": tensor(frozen, (512, 2048)), "head": tensor(head, (256, 192)), "step": head}


def save(path: str, fs: pafs.FileSystem, frozen: int, head: int) -> None:
    dcp.save(state(frozen, head), storage_writer=NodeStorageWriter(path, fs), no_dist=True)


def restored(path: Path, fs: pafs.FileSystem, frozen: int, head: int) -> bool:
    """Whether ``path`` loads back exactly ``state(frozen, head)``."""
    expected = state(frozen, head)
    got = {"frozen": torch.zeros(512, 2048), "head": torch.zeros(256, 192), "step": -1}
    air_transfer.dcp.load(got, Checkpoint(str(path), filesystem=fs))
    return got["step"] == head and all(torch.equal(got[k], expected[k]) for k in ("frozen", "head"))


def counters() -> Counter[str]:
    return Counter(ray.get(node_agent(node_ids()["head"]).incremental_counters.remote()))


def saved(rank: Any, path: Path, fs: pafs.FileSystem, frozen: int, head: int) -> Counter[str]:
    """Save from node a; what the storage node's counters say it cost."""
    before = counters()
    ray.get(rank.run.remote(save, str(path), fs, frozen, head))
    return counters() - before


def files(checkpoint: Path) -> list[Path]:
    return sorted(checkpoint.iterdir())


def stored_chunks(checkpoints: list[Path]) -> set[tuple[str, int]]:
    """``(checksum, length)`` of every chunk (tails too) the files of ``checkpoints``
    hold now, but of files smaller than a chunk (not offered to later saves)."""
    have = set()
    for f in (f for c in checkpoints for f in files(c)):
        body = f.read_bytes()
        if len(body) >= CHUNK:
            pieces = (body[o : o + CHUNK] for o in range(0, len(body), CHUNK))
            have |= {(chunk_checksum(p), len(p)) for p in pieces}
    return have


def must_send(checkpoint: Path, earlier: list[Path]) -> int:
    """The bytes a save of ``checkpoint`` must send when ``earlier`` saves are stored
    under the root: the chunks none of their files holds now, and each tail under a
    quarter of a chunk (never asked about)."""
    have, sent = stored_chunks(earlier), 0
    for f in files(checkpoint):
        body = f.read_bytes()
        for piece in (body[o : o + CHUNK] for o in range(0, len(body), CHUNK)):
            asked = 4 * len(piece) >= CHUNK
            sent += 0 if asked and (chunk_checksum(piece), len(piece)) in have else len(piece)
    return sent


def size(checkpoint: Path) -> int:
    return sum(f.stat().st_size for f in files(checkpoint))


def test_a_save_sends_only_the_chunks_no_earlier_save_holds(
    rank: Any, fs: pafs.FileSystem, tmp_path: Path
) -> None:
    c = [tmp_path / f"c{i}" for i in range(4)]
    cost = saved(rank, c[0], fs, 1, 1)  # nothing stored yet: everything travels
    assert cost["bytes_sent"] == size(c[0]) and cost["bytes_reused"] == 0

    cost = saved(rank, c[1], fs, 1, 2)  # the frozen tensor unchanged
    sent = must_send(c[1], c[:1])
    assert cost["bytes_sent"] == sent and sent <= 0.15 * size(c[1])
    assert cost["bytes_reused"] == size(c[1]) - sent and cost["chunks_rejected"] == 0

    cost = saved(rank, c[2], fs, 3, 3)  # all changed
    assert cost["bytes_sent"] == must_send(c[2], c[:2]) == size(c[2])

    assert 4 * ((c[2] / "__0_0.distcp").stat().st_size % CHUNK) >= CHUNK  # a tail asked about
    cost = saved(rank, c[3], fs, 3, 3)  # all unchanged: only small tails travel
    sent = must_send(c[3], c[:3])
    assert cost["bytes_sent"] == sent and cost["bytes_reused"] == size(c[3]) - sent
    assert sent <= sum(f.stat().st_size % CHUNK for f in files(c[3]))
    for path, (frozen, head) in zip(c, [(1, 1), (1, 2), (3, 3), (3, 3)], strict=True):
        assert restored(path, fs, frozen, head), path


def shard(checkpoint: Path) -> Path:
    [one] = [f for f in files(checkpoint) if f.suffix == ".distcp"]
    return one


def test_a_save_on_the_storage_node_stores_an_unchanged_shard_once(
    rank: Any, fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """This process runs on the storage node, so its bytes never travel: a shard
    unchanged since an earlier save becomes a hard link of the stored one (one copy on
    disk) and a changed one does not; the saved shards serve a save from node a; the
    older save deleted, the newer restore whole."""
    c = [tmp_path / f"c{i}" for i in range(4)]
    before = counters()
    save(str(c[0]), fs, 1, 1)
    save(str(c[1]), fs, 1, 1)  # all unchanged
    cost = counters() - before
    assert shard(c[1]).stat().st_ino == shard(c[0]).stat().st_ino
    assert cost["files_linked"] == 1 and cost["bytes_linked"] == shard(c[1]).stat().st_size
    assert cost["bytes_sent"] == 0

    save(str(c[2]), fs, 1, 2)  # the head changed
    assert shard(c[2]).stat().st_ino != shard(c[0]).stat().st_ino
    assert (counters() - before)["files_linked"] == 1
    cost = saved(rank, c[3], fs, 1, 2)  # from node a, after c[2] was written here
    assert cost["bytes_sent"] == must_send(c[3], c[2:3]) < CHUNK

    fs.delete_dir(str(c[0]))
    for path, (frozen, head) in zip(c[1:], [(1, 1), (1, 2), (1, 2)], strict=True):
        assert restored(path, fs, frozen, head), path


def test_two_writers_on_the_storage_node_link_one_stored_shard_at_once(
    fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """Two writers on the storage node store a stored shard's bytes at once, in writes
    that do not line up with chunks: each file becomes a hard link of it, whole,
    whichever commits first."""
    base = tmp_path / "base"
    save(str(base), fs, 1, 1)
    body, names = shard(base).read_bytes(), ("one", "two")
    (tmp_path / "d").mkdir()
    errors: list[BaseException] = []

    def write(name: str) -> None:
        try:
            with fs.open_output_stream(str(tmp_path / "d" / name)) as f:
                for offset in range(0, len(body), 100_000):
                    f.write(body[offset : offset + 100_000])
        except BaseException as e:
            errors.append(e)

    before = counters()
    writers = [threading.Thread(target=write, args=(name,)) for name in names]
    for t in writers:
        t.start()
    for t in writers:
        t.join(timeout=120)
    assert errors == [] and not any(t.is_alive() for t in writers)
    assert (counters() - before)["files_linked"] == 2
    for name in names:
        written = tmp_path / "d" / name
        assert written.stat().st_ino == shard(base).stat().st_ino
        assert written.read_bytes() == body


def test_a_corrupted_stored_chunk_is_sent_and_deleting_the_older_save_keeps_the_newer(
    rank: Any, fs: pafs.FileSystem, tmp_path: Path
) -> None:
    c = [tmp_path / f"c{i}" for i in range(3)]
    saved(rank, c[0], fs, 1, 1)
    with open(c[0] / "__0_0.distcp", "r+b") as f:  # inside the frozen tensor's bytes
        f.seek(5 * CHUNK + 100)
        f.write(os.urandom(64))
    cost = saved(rank, c[1], fs, 1, 2)
    assert cost["chunks_rejected"] == 1 and cost["bytes_sent"] == must_send(c[1], c[:1])
    assert restored(c[1], fs, 1, 2)

    fs.delete_dir(str(c[0]))
    assert restored(c[1], fs, 1, 2)
    cost = saved(rank, c[2], fs, 1, 2)  # from the newer save, the older one gone
    assert cost["bytes_sent"] == must_send(c[2], c[1:2]) < CHUNK
    assert restored(c[2], fs, 1, 2) and restored(c[1], fs, 1, 2)


def test_two_saves_sharing_a_base_at_once(rank: Any, fs: pafs.FileSystem, tmp_path: Path) -> None:
    """Both reuse the base's frozen chunks whichever runs first (neither holds a
    chunk of the other's changed ones), and all three restore exactly."""
    base, one, two = tmp_path / "base", tmp_path / "one", tmp_path / "two"
    saved(rank, base, fs, 1, 1)
    before = counters()
    ray.get([rank.run.remote(save, str(p), fs, 1, h) for p, h in ((one, 2), (two, 3))])
    cost = counters() - before
    assert cost["bytes_sent"] == must_send(one, [base]) + must_send(two, [base])
    assert cost["bytes_sent"] + cost["bytes_reused"] == size(one) + size(two)
    assert restored(base, fs, 1, 1) and restored(one, fs, 1, 2) and restored(two, fs, 1, 3)


def fail_while_saving(path: str, fs: pafs.FileSystem) -> str:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    class Failing(DefaultSavePlanner):
        def resolve_data(self, write_item: Any) -> Any:
            if write_item.index.fqn == "head":  # after the frozen tensor's chunks
                raise RuntimeError("injected failure while writing")
            return super().resolve_data(write_item)

    writer = NodeStorageWriter(path, fs)
    try:
        dcp.save(state(1, 2), storage_writer=writer, planner=Failing(), no_dist=True)
    except BaseException as e:
        return str(e)
    return "no error"


def test_a_failed_incremental_save_leaves_nothing(
    rank: Any, fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """Its chunks reused and sent, then the save fails: no file, no staging file."""
    base, failed = tmp_path / "base", tmp_path / "failed"
    saved(rank, base, fs, 1, 1)
    before = counters()
    error = ray.get(rank.run.remote(fail_while_saving, str(failed), fs))
    assert "injected failure while writing" in error
    assert (counters() - before)["bytes_reused"] > 0
    eventually(lambda: os.listdir(failed) == [], lambda: f"left: {os.listdir(failed)}")
    assert restored(base, fs, 1, 1)


@ray.remote(num_cpus=0, max_retries=0)
def write_and_die(fs: pafs.FileSystem, path: str, body: bytes) -> None:
    """Write ``body`` into an incremental stream and die with chunks in flight (the
    storage agent may be fetching one from this process's object store)."""
    f = fs.open_output_stream(path)
    f.write(body)
    os._exit(1)


def test_a_writer_dying_mid_stream_publishes_nothing(
    rank: Any, fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """Whenever the writer dies, its file never appears, and the storage agent goes
    on storing (a save after it is whole)."""
    (tmp_path / "d").mkdir()
    with pytest.raises(ray.exceptions.RayError):
        ray.get(write_and_die.options(resources={"node_a": 0.01}).remote(
            fs, str(tmp_path / "d/f"), os.urandom(6 * CHUNK)
        ))  # fmt: skip
    assert fs.get_file_info(pafs.FileSelector(str(tmp_path / "d"))) == []
    saved(rank, tmp_path / "c", fs, 1, 1)
    assert restored(tmp_path / "c", fs, 1, 1)


@ray.remote(num_cpus=0)
class OpenStream:
    """An incremental stream held open on node a between calls."""

    def write(self, fs: pafs.FileSystem, path: str, body: bytes) -> None:
        self.f = fs.open_output_stream(path)
        self.f.write(body)
        self.f.flush()

    def close(self) -> str:
        try:
            self.f.close()
        except Exception as e:  # what the writer sees
            return type(e).__name__
        return "closed"


def test_the_storage_agent_dying_mid_stream_publishes_nothing(
    rank: Any, fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """The storage node's agent killed while a stream is open (its chunks reused or
    sent, nothing committed): closing it is an error, the file never appears, no
    staging file stays once the agent is replaced, and the next save and every
    stored one restore whole."""
    base = tmp_path / "base"
    saved(rank, base, fs, 1, 1)
    (tmp_path / "d").mkdir()
    body = (base / "__0_0.distcp").read_bytes()[: 6 * CHUNK] + os.urandom(2 * CHUNK)
    stream = OpenStream.options(resources={"node_a": 0.01}).remote()
    ray.get(stream.write.remote(fs, str(tmp_path / "d/f"), body))
    kill_and_wait(node_agent(node_ids()["head"]))
    assert ray.get(stream.close.remote()) in {"ConnectionError", "CheckpointLostError"}
    ray.kill(stream)
    eventually(
        lambda: (
            fs.get_file_info(pafs.FileSelector(str(tmp_path / "d"))) == []
            and os.listdir(tmp_path / "d") == []
        ),
        lambda: f"left: {os.listdir(tmp_path / 'd')}",
    )
    saved(rank, tmp_path / "next", fs, 1, 2)
    assert restored(tmp_path / "next", fs, 1, 2) and restored(base, fs, 1, 1)
