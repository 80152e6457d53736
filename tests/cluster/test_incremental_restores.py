"""Restores of a kept checkpoint while later incremental saves link its files and
``num_to_keep`` deletes them again (node storage on the driver's node, the storage
node): each hard link made or dropped changes the stored inode's link count and
ctime, never its bytes, and a restore must not take that for a change. Each test
holds the restore mid-read (the storage agent's packing, or the restoring process's
own reading, stopped after a span of the big file), makes one save and one delete
there (the race, forced: the inode's link count rose and its ctime moved while the
read was held), then lets it finish: Ray Train's restore path (``to_directory``
through the hook) on the storage node and from ``node_a``, and a torch DCP load from
``node_a``, all bit-identical. A checkpoint deleted during its own restore fails with
FileNotFoundError, nothing published."""

from __future__ import annotations

import os
from collections.abc import Callable
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
from air_transfer.core import proven_read
from air_transfer.dcp import NodeStorageWriter
from air_transfer.train.hooks import upload_directory
from tests.support.checkpoints import MiB, digest_tree, make_checkpoint, on
from tests.support.cluster import node_ids, release_read_caches
from tests.support.dcp_fns import digest, tensor
from tests.support.gates import Gate, HoldPackingAt, hold_packing

pytestmark = [
    pytest.mark.usefixtures("cluster"),
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]
CONFIG = TransferConfig(chunk_bytes=MiB, window=4, incremental=True)
#: The restores stop once a span this far into the big file has been read.
HOLD_AT = 2 * MiB


class Storage:
    """Incremental node storage on the driver's node under ``root``: a kept
    checkpoint, and saves of the same bytes that come and go as under
    ``num_to_keep=1`` (each save hard-links the kept checkpoint's files, each
    delete of the one before drops its links). ``save(fs, path)`` stores one, on
    node b."""

    def __init__(self, root: Path, save: Callable[[pafs.FileSystem, str], None]) -> None:
        self.root = root
        self.fs = air_transfer.storage_filesystem(
            node=node_ids()["head"], config=CONFIG, root=str(root)
        )
        # From node b, as a worker there reports: not through the storage agent's
        # packing thread, which a test holds mid-read.
        self.save = lambda path: ray.get(call.options(**on("node_b")).remote(save, self.fs, path))
        self.kept = str(root / "kept")
        self.saved: list[str] = []
        self.save(self.kept)

    def churn(self, watched: Path) -> None:
        """One save and one delete; assert they linked and unlinked ``watched``."""
        before = os.stat(watched)
        path = str(self.root / f"later{len(self.saved)}")
        self.save(path)
        linked = os.stat(watched)
        assert linked.st_nlink > before.st_nlink, "the later save did not link the file"
        if self.saved:
            self.fs.delete_dir(self.saved.pop())  # as num_to_keep deletes
            assert os.stat(watched).st_nlink < linked.st_nlink
        self.saved.append(path)
        assert os.stat(watched).st_ctime_ns != before.st_ctime_ns


@ray.remote(num_cpus=0, max_retries=0)
def call(fn: Callable[..., None], *args: Any) -> None:
    fn(*args)


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return make_checkpoint(tmp_path / "src", 4 * MiB)


@pytest.fixture
def tree(tmp_path: Path, src: Path) -> Storage:
    """Train reports of ``src``: the kept one and later ones, each stored as Ray
    Train's report hook stores it (``upload_directory``)."""
    return Storage(
        tmp_path / "storage", lambda fs, path: upload_directory(fs, path, Checkpoint(str(src)))
    )


@ray.remote(num_cpus=0, max_retries=0)
def restore(fs: pafs.FileSystem, path: str, target: str) -> tuple[str, Any]:
    """``Checkpoint.to_directory`` as a Train worker's restore calls it (through the
    hook: ``train.hooks.download_directory``); the tree's digests, or the error raised."""
    try:
        return "ok", digest_tree(Checkpoint(path, filesystem=fs).to_directory(target))
    except Exception as e:
        return type(e).__name__, str(e)


def held_in_storage_agent(start: Callable[[], Any], meanwhile: Callable[[], None]) -> Any:
    """Run ``start()`` (a remote restore), hold the storage agent's packing after a
    span at ``HOLD_AT``, run ``meanwhile()`` there, let it finish: its result."""
    release_read_caches()  # so that the restore packs the files now
    agent, gate = node_agent(node_ids()["head"]), Gate.remote()
    hold_packing(agent, HoldPackingAt(HOLD_AT, gate))
    try:
        pending = start()
        ray.get(gate.wait_for_arrivals.remote(1), timeout=60)
        meanwhile()
    finally:
        hold_packing(agent, None)
        ray.get(gate.open.remote())
    result = ray.get(pending, timeout=120)
    ray.kill(gate)
    return result


def test_a_restore_from_another_node_while_later_saves_link_and_unlink_its_files(
    tree: Storage, src: Path, tmp_path: Path
) -> None:
    big = Path(tree.kept) / "model.bin"
    result = held_in_storage_agent(
        lambda: restore.options(**on("node_a")).remote(tree.fs, tree.kept, str(tmp_path / "out")),
        lambda: tree.churn(big),
    )
    assert result == ("ok", digest_tree(src))


def test_a_restore_on_the_storage_node_while_later_saves_link_and_unlink_its_files(
    tree: Storage, src: Path, tmp_path: Path
) -> None:
    """The restore runs here (the driver is on the storage node): a copy on this
    disk, held by this process's own packing hook."""
    big = Path(tree.kept) / "model.bin"
    churned = []

    def hook(where: str, span: Any) -> None:
        if where.endswith("/model.bin") and span.file_offset >= HOLD_AT and not churned:
            churned.append(1)
            tree.churn(big)

    proven_read._after_span_read = hook
    try:
        out = Checkpoint(tree.kept, filesystem=tree.fs).to_directory(str(tmp_path / "out"))
    finally:
        proven_read._after_span_read = None
    assert churned and digest_tree(out) == digest_tree(src)


def test_a_checkpoint_deleted_during_its_own_restore_is_a_file_not_found_error(
    tree: Storage, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    kind, message = held_in_storage_agent(
        lambda: restore.options(**on("node_a")).remote(tree.fs, tree.kept, str(out)),
        lambda: tree.fs.delete_dir(tree.kept),
    )
    assert kind == "FileNotFoundError", message
    # Nothing published (Ray's to_directory makes the directory itself, empty).
    assert not out.exists() or not any(out.iterdir())
    assert [p for p in os.listdir(tmp_path) if ".air-" in p] == []


def state() -> dict[str, Any]:
    return {"w": tensor(3, (1024, 1024)), "b": tensor(4, (64, 1024)), "step": 7}


def dcp_save(fs: pafs.FileSystem, path: str) -> None:
    dcp.save(state(), storage_writer=NodeStorageWriter(path, fs), no_dist=True)


@ray.remote(num_cpus=0, max_retries=0)
def dcp_load(fs: pafs.FileSystem, path: str) -> tuple[str, str]:
    """Load ``path`` (DCP's own reads: byte ranges of the shard, from the storage
    node's agent); the state's digest, or the error raised."""
    got = {"w": torch.zeros(1024, 1024), "b": torch.zeros(64, 1024), "step": 0}
    try:
        air_transfer.dcp.load(got, Checkpoint(path, filesystem=fs))
    except Exception as e:
        return type(e).__name__, str(e)
    return "ok", digest(got)


def test_a_dcp_load_from_another_node_while_later_saves_link_and_unlink_its_shard(
    tmp_path: Path,
) -> None:
    """Each later save of the same state is an unchanged shard, stored as a hard
    link of the kept one's; the load reads the kept shard's byte ranges."""
    storage = Storage(tmp_path / "storage", dcp_save)
    shard = Path(storage.kept) / "__0_0.distcp"
    storage.churn(shard)  # a later checkpoint to delete while the load is held
    result = held_in_storage_agent(
        lambda: dcp_load.options(**on("node_a")).remote(storage.fs, storage.kept),
        lambda: storage.churn(shard),
    )
    assert result == ("ok", digest(state()))
