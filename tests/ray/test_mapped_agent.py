"""Packing in the node agent. Mapped: chunks of a large file go into the store as
views of the file under a read lease, which the agent lets go of once Ray has
stored them; a truncate while a chunk is mapped never crashes the agent, however
long it stalls; and a
transfer's chunks leave the store once it is done and dropped. Live chunks
(``reuse_chunks``): a transfer takes the chunk objects the agent still holds for an
earlier one wherever they were packed from files unchanged since, packs only the
rest, and restores bit-identical."""

from __future__ import annotations

import gc
import os
import threading
import weakref
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle

from air_transfer import ChunkedCheckpoint, SourceChangedError, TransferConfig
from air_transfer.cluster._ray_core import object_store_free_bytes
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import node_agent, this_node_id
from air_transfer.cluster.transfer_leases import HeldTransfers
from air_transfer.config import MiB
from air_transfer.core.plan import Span
from tests.support import leases
from tests.support.leases import install_while_mapped, leased
from tests.support.live_chunks import (
    ALL,
    CHUNK,
    FILES,
    REUSE,
    chunks_of,
    counters,
    make_tree,
    restored,
    same,
    transfer,
)
from tests.support.rewriters import HOW, rewrite
from tests.support.trees import assert_same_tree
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("ray_local")
ray.cloudpickle.register_pickle_by_value(leases)

CONFIG = TransferConfig(chunk_bytes=2 * MiB, window=4, strategy="chunked")


@pytest.fixture
def agent() -> Any:
    handle = node_agent()
    yield handle
    install_while_mapped(handle, None)


def make_source(tmp_path: Path, nbytes: int) -> tuple[Path, bytes]:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(nbytes)
    (src / "w.bin").write_bytes(data)
    return src, data


class RecordLease:
    """Agent hook: write to ``marker`` whether a lease on the packed file was held
    while its chunk was mapped (``packer._while_mapped``)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __call__(self, where: str, span: Span) -> None:
        with open(os.path.join(os.path.dirname(os.path.dirname(where)), self.marker), "a") as f:
            f.write(f"{leases.lease_listed(where)}\n")


def test_the_agent_maps_chunks_and_lets_go_of_the_lease_once_they_are_stored(
    tmp_path: Path, agent: Any
) -> None:
    src, data = make_source(tmp_path, 6 * MiB)
    install_while_mapped(agent, RecordLease("leases.log"))
    # Not blocking: the agent packs every chunk (a blocking call packs half itself).
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref_async(config=CONFIG).result()
    assert (tmp_path / "leases.log").read_text().split() == ["True"] * 3
    # Packed and still referenced: the store has its copy, the file is free.
    eventually(lambda: not leased(src / "w.bin"), "the agent to release its lease")
    out = tmp_path / "out"
    ChunkedCheckpoint.from_object_ref(ref).to_directory(str(out))
    assert (out / "w.bin").read_bytes() == data


class StallWhileMapped:
    """Agent hook: the first time, stall with the chunk mapped until another
    process's truncate of the file went through (the kernel would have revoked a
    lease kept that long, and the agent would die of SIGBUS on resuming)."""

    fired = False

    def __call__(self, where: str, span: Span) -> None:
        if not self.fired:
            self.fired = True
            leases.truncated_while_stalled(where)


@pytest.mark.parametrize("size", [2 * MiB, 6 * MiB])
def test_an_agent_stalled_with_a_chunk_mapped_survives_a_truncate(
    tmp_path: Path, agent: Any, size: int
) -> None:
    """One chunk: packed whole from the version scanned (a private copy replaced
    the mapping before the lease was handed back). Several: a chunk packed after
    the truncate sees it, so the transfer raises SourceChangedError (or completes
    with the scanned bytes, if the stalled chunk was the last one packed). Either
    way the agent lives on, and a checkpoint it packed before still restores."""
    src, data = make_source(tmp_path, size)
    (tmp_path / "other").mkdir()
    other, other_data = make_source(tmp_path / "other", 4 * MiB)
    held = ChunkedCheckpoint.from_directory(other).to_object_ref_async(config=CONFIG).result()
    pid = ray.get(agent.pid.remote())
    install_while_mapped(agent, StallWhileMapped())
    out = tmp_path / "out"
    try:
        future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(config=CONFIG)
        ChunkedCheckpoint.from_object_ref(future.result()).to_directory(str(out))
    except SourceChangedError as e:
        assert size > CONFIG.chunk_bytes and e.filename == str(src / "w.bin")
        assert not out.exists()
    else:
        assert (out / "w.bin").read_bytes() == data
    assert os.path.getsize(src / "w.bin") == 0
    assert ray.get(agent.pid.remote()) == pid
    ChunkedCheckpoint.from_object_ref(held).to_directory(str(tmp_path / "out-other"))
    assert (tmp_path / "out-other" / "w.bin").read_bytes() == other_data


def store_free() -> int:
    free = object_store_free_bytes(this_node_id())
    assert free is not None
    return free


@ray.remote(num_cpus=0)
def restore(ckpt: ChunkedCheckpoint, target: str) -> None:
    ckpt.to_directory(target)


@pytest.mark.parametrize("blocking", [False, True])
def test_the_chunks_leave_the_store_once_the_transfer_is_done_and_dropped(
    tmp_path: Path, blocking: bool
) -> None:
    src, data = make_source(tmp_path, 48 * MiB)
    baseline = eventually(store_free, "the store's free bytes")
    ckpt = ChunkedCheckpoint.from_directory(src)
    future = None if blocking else ckpt.to_object_ref_async(config=CONFIG)
    ref = ckpt.to_object_ref(config=CONFIG) if future is None else future.ref
    ray.get(restore.remote(ChunkedCheckpoint.from_object_ref(ref), str(tmp_path / "out")))
    if future is not None:
        future.result()
    assert (tmp_path / "out" / "w.bin").read_bytes() == data
    # Still referenced: in the store (else the check below could not fail).
    eventually(lambda: store_free() < baseline - len(data) // 2, "the chunks in the store")
    del future, ref
    eventually(
        lambda: store_free() >= baseline - 2 * CONFIG.chunk_bytes,
        lambda: f"the chunks to leave the store ({baseline - store_free()} bytes still held)",
    )


def test_a_done_future_with_a_callback_is_freed_without_the_cyclic_gc(tmp_path: Path) -> None:
    """Its callbacks stay in ``concurrent.futures`` after they ran: a future they
    referenced would be freed (with the checkpoint's chunks) only by the cyclic GC."""
    src, _ = make_source(tmp_path, 4 * MiB)
    gc.disable()
    try:
        future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(config=CONFIG)
        ran: list[bool] = []
        future.add_done_callback(lambda f: ran.append(f.done()))
        future.result()
        eventually(lambda: ran, "the callback to run", interval_s=0)
        freed = weakref.ref(future)
        del future
        eventually(lambda: freed() is None, "the future freed by refcount", interval_s=0)
    finally:
        gc.enable()


# -- live chunks: a later transfer reuses what the agent still holds (reuse_chunks) ------
@pytest.mark.parametrize(
    ("unchanged", "config"),
    [(0, REUSE), (2, REUSE), (4, REUSE), (4, REUSE.replace(reuse_chunks=False))],
    ids=["0%", "50%", "100%", "100%-off"],
)
def test_exactly_the_chunks_of_unchanged_files_are_reused(
    tmp_path: Path, unchanged: int, config: TransferConfig
) -> None:
    src = make_tree(tmp_path)
    _first, first_ids = transfer(src)  # held: the agent keeps its chunks
    changed = set(FILES[unchanged:])
    for name in changed:
        rewrite(str(src / name), "in-place")
    before = counters()
    second, second_ids = transfer(src, config)
    after = counters()
    expected = chunks_of(set(FILES) - changed) if config.reuse_chunks else set()
    assert same(first_ids, second_ids) == expected
    assert after["bytes_packed"] - before["bytes_packed"] == (ALL - len(expected)) * CHUNK
    assert after["bytes_reused"] - before["bytes_reused"] == len(expected) * CHUNK
    assert_same_tree(src, restored(second, tmp_path, "out"))


@pytest.mark.parametrize("how", HOW)
def test_a_file_changed_between_the_transfers_is_packed_again(tmp_path: Path, how: str) -> None:
    """In place, in place with its mtime put back, or replaced by a rename: its stamp
    differs (ctime, inode), so its chunks are packed from the new bytes."""
    src = make_tree(tmp_path)
    _first, first_ids = transfer(src)
    rewrite(str(src / "b.bin"), how)
    second, second_ids = transfer(src)
    assert same(first_ids, second_ids) == chunks_of({"a.bin", "c.bin", "w.bin"})
    assert_same_tree(src, restored(second, tmp_path, "out"))


def test_a_transfer_released_before_the_next_one_is_packed_again(tmp_path: Path) -> None:
    """Once the agent dropped the earlier transfer's lease its chunks may be freed:
    none is offered again (never a lost object), the next transfer packs every byte."""
    src = make_tree(tmp_path)
    first, first_ids = transfer(src)
    key = first.hex()
    del first
    eventually(
        lambda: key not in ray.get(AgentClient().call(HeldTransfers.leases)),
        "the agent to drop the lease of the first transfer",
        60,
    )
    before = counters()
    second, second_ids = transfer(src)
    after = counters()
    assert not set(first_ids) & set(second_ids)
    assert after["bytes_packed"] - before["bytes_packed"] == ALL * CHUNK
    assert after["chunks_reused"] == before["chunks_reused"]
    assert_same_tree(src, restored(second, tmp_path, "out"))


def test_an_earlier_transfer_is_released_while_a_later_one_holds_its_chunks(
    tmp_path: Path,
) -> None:
    """The later transfer nests chunks of the earlier one, so holding it references
    them: the earlier one's lease (and its chunks of the changed file) must still go
    once its own ref is dropped, or every version would stay while the last lives."""
    src = make_tree(tmp_path)
    first, first_ids = transfer(src)
    key = first.hex()
    rewrite(str(src / "b.bin"), "in-place")
    second, second_ids = transfer(src)
    assert same(first_ids, second_ids) == chunks_of({"a.bin", "c.bin", "w.bin"})
    del first
    eventually(
        lambda: key not in ray.get(AgentClient().call(HeldTransfers.leases)),
        "the agent to drop the lease of the earlier transfer",
        60,
    )
    assert second.hex() in ray.get(AgentClient().call(HeldTransfers.leases))
    assert_same_tree(src, restored(second, tmp_path, "out"))


def test_two_concurrent_transfers_sharing_a_base(tmp_path: Path) -> None:
    """Both take the base's chunks of the unchanged files; the chunks of the changed
    files are packed by both, or by one and reused by the other (whichever recorded
    its chunks first), never the base's; each restores the current tree. A third
    transfer then packs nothing (each chunk is offered by several of them)."""
    src = make_tree(tmp_path)
    _base, base_ids = transfer(src)
    rewrite(str(src / "a.bin"), "in-place")
    rewrite(str(src / "c.bin"), "in-place")
    results: list[tuple[Any, list[str]]] = []
    errors: list[BaseException] = []
    before = counters()

    def run() -> None:
        try:
            results.append(transfer(src))
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    after = counters()
    assert not errors and len(results) == 2
    unchanged, changed = chunks_of({"b.bin", "w.bin"}), chunks_of({"a.bin", "c.bin"})
    (_, one), (_, two) = results
    assert same(base_ids, one) == same(base_ids, two) == unchanged
    shared = same(one, two) - unchanged  # packed once, reused by the other
    assert shared in (set(), changed)
    packed = after["bytes_packed"] - before["bytes_packed"]
    assert packed == (2 * len(changed) - len(shared)) * CHUNK
    for n, (ref, _) in enumerate(results):
        assert_same_tree(src, restored(ref, tmp_path, f"out{n}"))
    third, third_ids = transfer(src)
    assert counters()["bytes_packed"] == after["bytes_packed"]
    assert set(third_ids) <= {*one, *two}
    assert_same_tree(src, restored(third, tmp_path, "out3"))
