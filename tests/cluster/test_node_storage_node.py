"""What only node storage does, on node ``node_a`` of the mock cluster: it keeps every
path inside its root, pickles to an equal filesystem, refuses an altered chunk, stores
large chunks exactly with or without direct I/O, reports a lost agent, stores a
transferred checkpoint, and stays within a few chunks of memory on both ends."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray

from air_transfer import (
    ChecksumError,
    ChunkedCheckpoint,
    SourceChangedError,
    TransferConfig,
    storage_filesystem,
)
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import node_agent
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.direct_io import MIN_DIRECT_FILE_BYTES
from air_transfer.storage.client.handler import NodeStorageHandler
from air_transfer.storage.node_api import NodeCheckpoints
from tests.support.checkpoints import MiB, digest_tree, kill_and_wait, make_checkpoint, on
from tests.support.cluster import node_ids
from tests.support.gates import Gate, HoldPackingAt, hold_packing
from tests.support.node_storage import BODY, CONFIG, raises, read, read_counters
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("cluster")


def test_paths_escaping_the_root_are_refused(node_fs: tuple[pafs.FileSystem, Path]) -> None:
    f, root = node_fs
    outside = str(root.parent / "secret")
    for path in (outside, f"{root}/../secret", f"{root}/link/secret", "../secret"):
        for op in (
            lambda p: f.get_file_info(p),
            lambda p: f.get_file_info(pafs.FileSelector(p)),
            lambda p: f.open_input_stream(p),
            lambda p: f.open_output_stream(p),
            lambda p: f.delete_file(p),
            lambda p: f.copy_file(f"{root}/d/f", p),
            lambda p: f.move(p, f"{root}/d/g"),
        ):
            err = raises(PermissionError, lambda: op(path))  # noqa: B023
            assert "outside the storage root" in str(err)
    raises(PermissionError, lambda: f.delete_dir(str(root)))
    assert (root.parent / "secret").read_bytes() == b"outside"
    # Relative paths are taken under the root; the root's own contents may go, but
    # never those of "/".
    assert read(f, "d/f") == b"inside"
    f.delete_dir_contents("/", accept_root_dir=True)
    assert os.listdir(root) == [] and (root.parent / "secret").exists()
    whole_disk = storage_filesystem(node=node_ids()["node_a"], root="/", expose_system_dirs=True)
    raises(PermissionError, lambda: whole_disk.delete_dir_contents("/", accept_root_dir=True))
    raises(PermissionError, lambda: whole_disk.delete_dir("/"))


@ray.remote
def use_remotely(f: pafs.FileSystem, path: str, expected: pafs.FileSystem) -> tuple[bool, bytes]:
    return f == expected, read(f, path)


def test_pickles_and_compares_equal_to_its_copies(node_fs: tuple[pafs.FileSystem, Path]) -> None:
    f, root = node_fs
    ids = node_ids()
    copy = pickle.loads(pickle.dumps(f))
    assert copy == f and copy.handler == f.handler and hash(copy.handler) == hash(f.handler)
    assert f != storage_filesystem(node=ids["node_b"], config=CONFIG, root=str(root))
    assert f != storage_filesystem(node=ids["node_a"], config=CONFIG, root=str(root / "d"))
    assert f != pafs.LocalFileSystem()
    same, body = ray.get(use_remotely.options(**on("node_b")).remote(f, f"{root}/d/f", f))
    assert same and body == b"inside"
    # Made before it knows its node: the node of the process that ships it.
    unresolved = pafs.PyFileSystem(NodeStorageHandler(None, str(root)))
    assert pickle.loads(pickle.dumps(unresolved)).handler.node_id == ids["head"]
    raises(ValueError, lambda: storage_filesystem(node="ab" * 28))
    raises(ValueError, lambda: storage_filesystem(root="relative"))


def test_an_upload_with_an_altered_chunk_is_not_stored(
    node_fs: tuple[pafs.FileSystem, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent refuses the second chunk; the chunks after it are written, so the
    staging file has the full size: only the writer's memory of the failure keeps
    a file with a hole from being committed."""
    import air_transfer.storage.client.uploads

    sent = []

    def checksum_altered_once(chunk: Any) -> str:
        sent.append(len(sent))
        return "0" * 32 if len(sent) == 2 else chunk_checksum(chunk)

    uploads = air_transfer.storage.client.uploads
    monkeypatch.setattr(uploads, "chunk_checksum", checksum_altered_once)
    f, root = node_fs
    (root / "d" / "f").write_bytes(b"old")
    altered = pytest.raises(ChecksumError, match="arrived altered")
    with altered, f.open_output_stream(f"{root}/d/f") as s:
        s.write(BODY * 2)  # eight chunks, more than the window
    assert os.listdir(root / "d") == ["f"] and (root / "d" / "f").read_bytes() == b"old"


@pytest.mark.parametrize("direct_io", [True, False])
def test_large_chunks_are_stored_exactly_with_or_without_direct_io(
    tmp_path: Path, direct_io: bool
) -> None:
    """Chunks large enough for the agent's ``O_DIRECT`` writes, and an unaligned tail
    that goes through the page cache: the stored file is the bytes written."""
    config = TransferConfig(chunk_bytes=MIN_DIRECT_FILE_BYTES, window=2, direct_io=direct_io)
    f = storage_filesystem(node=node_ids()["node_a"], config=config, root=str(tmp_path))
    body = os.urandom(2 * MIN_DIRECT_FILE_BYTES + 4097)
    with f.open_output_stream(f"{tmp_path}/model.bin") as s:
        s.write(body[:5])
        s.write(body[5:])
    assert (tmp_path / "model.bin").read_bytes() == body
    assert read(f, f"{tmp_path}/model.bin") == body
    assert os.listdir(tmp_path) == ["model.bin"]  # no staging file left


def test_a_file_that_changed_size_while_read_is_an_error(
    node_fs: tuple[pafs.FileSystem, Path],
) -> None:
    f, root = node_fs
    (root / "big").write_bytes(BODY)
    with f.open_input_stream(f"{root}/big") as s:
        os.truncate(root / "big", MiB)  # after the open, before the bytes are read
        changed = rf"changed while being read: {len(BODY)} bytes when opened, {MiB} now"
        with pytest.raises(SourceChangedError, match=changed):
            s.read()


def test_a_lost_agent_is_a_connection_error_then_replaced(
    node_fs: tuple[pafs.FileSystem, Path],
) -> None:
    f, _ = node_fs
    assert read(f, "d/f") == b"inside"
    kill_and_wait(node_agent(node_ids()["node_a"]))
    err = raises(ConnectionError, lambda: f.get_file_info("d/f"))
    assert node_ids()["node_a"] in str(err)
    assert read(f, "d/f") == b"inside"  # the next call starts a new agent


@pytest.mark.parametrize("storage", ["node-storage-here", "node-storage-elsewhere", "local"])
def test_an_agent_stores_a_transferred_checkpoint(tmp_path: Path, storage: str) -> None:
    """What ``checkpoint_upload_fn`` asks of the agent of node a: on its own disk via
    the verified writer, else through any pyarrow filesystem (here node b's storage)."""
    src = make_checkpoint(tmp_path / "src", 2 * MiB + 3)
    handle = ChunkedCheckpoint.from_directory(src).pack(CONFIG)
    ids = node_ids()
    target = {
        "node-storage-here": lambda: storage_filesystem(
            node=ids["node_a"], config=CONFIG, root=str(tmp_path)
        ),
        "node-storage-elsewhere": lambda: storage_filesystem(
            node=ids["node_b"], config=CONFIG, root=str(tmp_path)
        ),
        "local": pafs.LocalFileSystem,
    }[storage]()
    dest = str(tmp_path / "exp" / "checkpoint_0")
    ray.get(AgentClient(ids["node_a"]).call(NodeCheckpoints.store_checkpoint, handle, target, dest))
    assert digest_tree(dest) == digest_tree(src)


def rss_anon(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon in /proc/{pid}/status")


@ray.remote(num_cpus=0)
def write_then_read(f: pafs.FileSystem, src: str, dest: str, agent_pid: int) -> dict[str, int]:
    """Upload ``src`` to ``dest`` on ``f`` and read it back, sampling the private memory
    (not RSS: mapped object-store pages count there) of this process and the agent."""
    import hashlib
    import threading

    start = {"self": rss_anon(), "agent": rss_anon(agent_pid)}
    peak = dict(start)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for who, pid in (("self", "self"), ("agent", agent_pid)):
                peak[who] = max(peak[who], rss_anon(pid))
            done.wait(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with open(src, "rb") as i, f.open_output_stream(dest) as o:
            while block := i.read(4 * MiB):
                o.write(block)
        h = hashlib.sha256()
        with f.open_input_stream(dest) as i:
            while block := i.read(4 * MiB):
                h.update(block)
    finally:
        done.set()
        sampler.join()
    with open(src, "rb") as i:
        same = h.digest() == hashlib.file_digest(i, "sha256").digest()
    return {"same": same, **{k: peak[k] - start[k] for k in peak}}


def test_memory_stays_within_a_few_chunks_on_both_ends(tmp_path: Path) -> None:
    size, config = 160 * MiB, TransferConfig(chunk_bytes=2 * MiB, window=4)
    bound = 4 * config.chunk_bytes + 48 * MiB
    src = tmp_path / "src.bin"
    with open(src, "wb") as out:
        for _ in range(size // (16 * MiB)):
            out.write(os.urandom(16 * MiB))
    ids = node_ids()
    f = storage_filesystem(node=ids["node_a"], config=config, root=str(tmp_path))
    agent_pid = ray.get(node_agent(ids["node_a"]).pid.remote())
    growth = ray.get(
        write_then_read.options(**on("node_b")).remote(
            f, str(src), str(tmp_path / "dest.bin"), agent_pid
        )
    )
    assert growth["same"] and (tmp_path / "dest.bin").stat().st_size == size
    assert growth["self"] < bound, f"the client grew {growth['self'] / MiB:.0f} MiB"
    assert growth["agent"] < bound, f"the agent grew {growth['agent'] / MiB:.0f} MiB"


@ray.remote(num_cpus=0)
def restore(f: pafs.FileSystem, path: str, local: str) -> dict[str, str]:
    """What Ray Train's restore on another node does with a node-storage checkpoint."""
    from air_transfer.train.hooks import download_directory

    assert download_directory(f, path, local)
    return digest_tree(local)


def test_restores_at_the_same_time_share_one_pack_larger_than_the_budget(tmp_path: Path) -> None:
    """Defect: a checkpoint larger than ``cache_bytes`` was packed once per reader,
    even by simultaneous ones (4 restores of 2 GiB read 8 GiB from the storage disk
    and spilled its store): the transfer just packed was evicted at once. Readers in
    flight share one pack whatever its size; the budget bounds what is kept after."""
    src = make_checkpoint(tmp_path / "ckpt", 6 * MiB)
    size = sum(p.stat().st_size for p in src.rglob("*") if p.is_file())
    f = storage_filesystem(
        node=node_ids()["node_a"], config=CONFIG.replace(cache_bytes=MiB), root=str(tmp_path)
    )
    agent = node_agent(node_ids()["node_a"])
    before = read_counters("node_a")
    gate = Gate.options(**on("head")).remote()
    hold_packing(agent, HoldPackingAt(2 * MiB, gate))
    try:
        first = restore.options(**on("node_b")).remote(f, str(src), str(tmp_path / "r0"))
        ray.get(gate.wait_for_arrivals.remote(1), timeout=60)  # the first is mid-read
        others = [
            restore.options(**on(node)).remote(f, str(src), str(tmp_path / f"r{i}"))
            for i, node in ((1, "head"), (2, "node_b"))
        ]

        def served() -> int:
            return read_counters("node_a")["bytes_served"] - before["bytes_served"]

        eventually(lambda: served() == 3 * size, "the other readers to get the transfer", 180)
    finally:
        ray.get(gate.open.remote())
        hold_packing(agent, None)
    assert ray.get([first, *others], timeout=120) == [digest_tree(src)] * 3
    after = read_counters("node_a")
    assert after["transfers_packed"] - before["transfers_packed"] == 1
    assert after["bytes_read"] - before["bytes_read"] == size
    assert after["transfer_readers"] == 0 and after["bytes_held"] <= MiB
