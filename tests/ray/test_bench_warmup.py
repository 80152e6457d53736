"""The bench's store warm-up: each endpoint process maps most of the object store
once, untimed, and leaves nothing behind in it (a real local Ray, no timing); and
``bench --call``'s producer at toy sizes."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from air_transfer.cluster.nodes import node_agent
from air_transfer.config import TransferConfig
from benchmarks.bench import endpoint
from benchmarks.bench.call_path import Caller, _result, format_call_table, sparse_checkpoint
from benchmarks.bench.data import make_checkpoint
from benchmarks.bench.endpoint import Ends
from benchmarks.bench.sampler import object_store_used, wait_for_store_at_most

pytestmark = pytest.mark.usefixtures("ray_local")


def node_store_bytes() -> int:
    (node,) = [n for n in ray.nodes() if n["Alive"]]
    return int(node["Resources"]["object_store_memory"])


@pytest.fixture(scope="module")
def ends() -> Iterator[Ends]:
    pair = Ends.start(TransferConfig(), cross_node=False)
    yield pair
    pair.kill()


def test_fill_puts_the_fraction_of_the_store_in_whole_pieces(ends: Ends) -> None:
    refs = ray.get(ends.producer.fill_store.remote(0.5))
    piece = endpoint.STORE_PIECE_BYTES
    target = int(node_store_bytes() * 0.5)
    assert len(refs) == target // piece > 0
    assert all(len(ray.get(r)) == piece for r in refs[:2])


def test_touch_reads_one_byte_in_every_page(ends: Ends) -> None:
    refs = ray.get(ends.producer.fill_store.remote(0.25))
    pages = ray.get(ends.consumer.touch_store.remote(refs))
    # Every piece is all ones: one byte summed per 4 KiB page of every piece.
    assert pages == len(refs) * endpoint.STORE_PIECE_BYTES // endpoint.PAGE_BYTES


def test_warm_store_leaves_the_store_as_it_found_it(ends: Ends) -> None:
    """Every piece the warm-up put is freed. Freeing is asynchronous (the pieces'
    owner, the actor or agent that put them, frees them once the last borrower lets
    go), so this waits for it with a deadline rather than looking once: a busy
    machine once took longer than the warm-up's own wait."""
    before = object_store_used()
    ends.warm_store()
    assert wait_for_store_at_most(before + endpoint.STORE_PIECE_BYTES, timeout_s=120.0), (
        f"the store still holds {object_store_used()} bytes, {before} before the warm-up"
    )


def shared_bytes(pid: int) -> int:
    """``RssShmem`` of ``pid``: the object-store pages it has mapped (the store is a
    shared-memory file)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssShmem in /proc/{pid}/status")


def test_warm_store_maps_the_store_into_the_agent_that_packs(ends: Ends) -> None:
    """The node's agent packs every chunk (``to_object_ref`` submits the packing to
    it), so its first writes to the store's pages are the ones that fault: the
    warm-up maps most of the store into it too, not only into the producer and
    consumer (the warm-up once skipped it, and the first trip paid for it)."""
    agent = int(ray.get(node_agent(ends.producer_node).pid.remote()))
    ends.warm_store()
    assert shared_bytes(agent) >= 0.6 * node_store_bytes()


def test_bench_call_times_the_call_alone(tmp_path: Path) -> None:
    """``bench --call``'s producer, here in the driver, at toy sizes: the sparse
    checkpoint uses no disk and its packing ends stopped, with SourceChangedError, as
    the touch right after the call makes it; the small tree is packed whole; the
    report says both and compares only the cases that have a bar."""
    config = TransferConfig(chunk_bytes=1024**2, window=4, strategy="chunked")
    src, model = sparse_checkpoint(str(tmp_path), 10**7)
    assert os.stat(model).st_blocks == 0
    tree = make_checkpoint(str(tmp_path), "small", 30 * 1024, 1024)
    caller = Caller()
    stopped = [caller.call(src, config, model) for _ in range(2)]
    packed = [caller.call(tree, config, None) for _ in range(2)]
    assert [r["outcome"] for r in stopped + packed] == ["stopped"] * 2 + ["packed"] * 2
    assert [r["files"] for r in packed] == [30, 30]
    rows = [_result("0.01 GB sparse", 10**7, 1, None, stopped),
            _result("30 files", 30 * 1024, 30, 1e-9, packed)]  # fmt: skip
    assert [(r["verified"], r["bar_met"]) for r in rows] == [(True, None), (True, False)]
    table = format_call_table(rows)
    assert "0.01 GB sparse" in table and table.splitlines()[2].split()[-2:] == ["NO", "yes"]
