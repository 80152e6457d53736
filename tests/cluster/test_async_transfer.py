"""Non-blocking transfers (``to_object_ref_async``) on a mock cluster: the ref is
usable at once, readers on other processes and nodes start before packing is done,
errors of packing reach both the future and every reader, and ownership holds when
the caller dies while packing still runs.

"While packing is still running" is made a known state: a hook in the packing node's
agent stops packing at a chosen chunk until the test opens a Gate.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from air_transfer import (
    CheckpointLostError,
    ChunkedCheckpoint,
    SourceChangedError,
    TransferConfig,
)
from air_transfer.cluster.nodes import node_agent
from air_transfer.transfer.future import TransferFuture
from tests.support.checkpoints import MiB, digest_tree, make_checkpoint, on
from tests.support.cluster import connect, node_ids
from tests.support.gates import Gate, HoldPackingAt, hold_packing

pytestmark = pytest.mark.usefixtures("cluster")
CHUNK = 1 * MiB
CONFIG = TransferConfig(chunk_bytes=CHUNK, window=2)
HOLD_AT = 6 * MiB  # packing stops after the span that reaches 6 MiB into model.bin


@pytest.fixture
def held() -> Iterator[Any]:
    """A gate at which the head node's agent stops packing (the driver packs there);
    opened and cleared after the test whatever happened."""
    gate = Gate.remote()
    agent = node_agent(node_ids()["head"])
    hold_packing(agent, HoldPackingAt(HOLD_AT, gate))
    yield gate
    ray.get(gate.open.remote())
    hold_packing(agent, None)


def wait_until_held(gate: Any) -> None:
    ray.get(gate.wait_for_arrivals.remote(1), timeout=60)


@ray.remote
def first_bytes(ckpt: ChunkedCheckpoint, n: int) -> tuple[bytes, str]:
    """Read the first ``n`` bytes of model.bin from a checkpoint passed as a
    top-level argument (Ray hands the task the checkpoint itself)."""
    with ChunkedCheckpoint.from_object_ref(ckpt).open("model.bin") as f:
        return f.read(n), ray.get_runtime_context().get_node_id()


@ray.remote
def restore(ref_in_list: list[Any], out: str) -> dict[str, str]:
    ChunkedCheckpoint.from_object_ref(ref_in_list[0]).to_directory(out)
    return digest_tree(out)


def test_the_ref_is_usable_before_packing_is_done(tmp_path: Path, held: Any) -> None:
    """Readers on another node and in another process start on the first chunks while
    packing is stopped at chunk 6; once packing resumes, a reader that was already
    waiting gets the whole checkpoint, verified, and the future completes."""
    src = make_checkpoint(tmp_path / "src", 12 * MiB)
    future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(CONFIG)
    assert isinstance(future, TransferFuture)
    wait_until_held(held)
    assert not future.done()
    with pytest.raises(TimeoutError):
        future.result(timeout=0.2)
    ids = node_ids()
    head, node_b = (
        first_bytes.options(**on(name)).remote(future.ref, 64 * 1024) for name in ("head", "node_b")
    )
    expected = (src / "model.bin").read_bytes()[: 64 * 1024]
    assert ray.get(head, timeout=60) == (expected, ids["head"])
    assert ray.get(node_b, timeout=60) == (expected, ids["node_b"])
    # A whole restore on node_a starts now and can only finish after packing does.
    out = str(tmp_path / "out")
    restoring = restore.options(**on("node_a")).remote([future.ref], out)
    ready, _ = ray.wait([restoring], timeout=0.5)
    assert not ready and not future.done()
    ray.get(held.open.remote())
    assert future.result(timeout=60) is future.ref
    assert ray.get(restoring, timeout=120) == digest_tree(src)


def test_future_api_matches_concurrent_futures(tmp_path: Path, held: Any) -> None:
    """A ``concurrent.futures.Future``: running from the start, never cancelled,
    waited for by ``concurrent.futures.wait`` and ``as_completed`` beside a plain
    future, its callbacks called with it."""
    src = make_checkpoint(tmp_path / "src", 8 * MiB)
    future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(CONFIG)
    wait_until_held(held)
    assert isinstance(future, concurrent.futures.Future)
    assert future.running() and not future.cancel() and not future.cancelled()
    plain: concurrent.futures.Future[str] = concurrent.futures.Future()
    plain.set_result("other")
    done, pending = concurrent.futures.wait([future, plain], timeout=0.2)
    assert done == {plain} and pending == {future}
    called = threading.Event()
    seen: list[TransferFuture] = []
    future.add_done_callback(lambda f: (seen.append(f), called.set()))
    assert not called.is_set() and "packing" in repr(future)
    ray.get(held.open.remote())
    assert called.wait(timeout=60) and seen == [future]
    assert future.done() and future.exception() is None and "done" in repr(future)
    assert list(concurrent.futures.as_completed([future], timeout=5)) == [future]
    assert not future.cancel() and not future.running()
    late: concurrent.futures.Future[TransferFuture] = concurrent.futures.Future()
    future.add_done_callback(late.set_result)  # already done: called at once
    assert late.result(timeout=5) is future
    restored = ChunkedCheckpoint.from_object_ref(future.result())
    assert restored.manifest.is_complete
    assert digest_tree(restored.to_directory(tmp_path / "out")) == digest_tree(src)


def test_a_source_changed_mid_pack_reaches_the_future_and_every_reader(
    tmp_path: Path, held: Any
) -> None:
    """model.bin is rewritten (same size) while packing is stopped: the future and a
    reader that was already waiting both raise SourceChangedError naming it, and the
    reader publishes nothing. (Defect found here: raising the error a reader fetched
    made a reference cycle through its frames, which kept the chunks packed before the
    failure pinned until a garbage collection; the fixture checks they are freed.)"""
    src = make_checkpoint(tmp_path / "src", 12 * MiB)
    future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(CONFIG)
    wait_until_held(held)
    out = str(tmp_path / "out")
    restoring = restore.options(**on("node_b")).remote([future.ref], out)
    with open(src / "model.bin", "r+b") as f:  # the training loop writes the next epoch
        f.seek(HOLD_AT + CHUNK)
        f.write(os.urandom(CHUNK))
    ray.get(held.open.remote())
    with pytest.raises(SourceChangedError, match=r"model\.bin"):
        future.result(timeout=60)
    assert isinstance(future.exception(), SourceChangedError)
    with pytest.raises(SourceChangedError, match=r"model\.bin"):
        ray.get(restoring, timeout=120)
    assert not os.path.exists(out)
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]
    with pytest.raises(SourceChangedError):
        ChunkedCheckpoint.from_object_ref(future.ref).to_directory(tmp_path / "again")


@ray.remote(num_cpus=0)
class Caller:
    """A training worker that starts a transfer and dies while it is packed."""

    def start(self, src: str, config: TransferConfig) -> list[Any]:
        self.future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(config)
        return [self.future.ref]


@pytest.mark.parametrize("owner", ["node", "caller"])
def test_the_caller_killed_mid_pack(tmp_path: Path, owner: str) -> None:
    """``owner="node"``: the agent submitted the packing and owns every chunk, so the
    checkpoint is readable after the caller died mid-pack. ``owner="caller"``: the
    chunks died with it, CheckpointLostError, nothing published."""
    src = make_checkpoint(tmp_path / "src", 12 * MiB)
    config = CONFIG.replace(owner=owner)
    gate = Gate.remote()
    agent = node_agent(node_ids()["node_a"])
    hold_packing(agent, HoldPackingAt(HOLD_AT, gate))
    try:
        caller = Caller.options(**on("node_a")).remote()
        [ref] = ray.get(caller.start.remote(str(src), config))
        wait_until_held(gate)
        ray.kill(caller)
        ray.get(gate.open.remote())
        out = tmp_path / "out"
        if owner == "node":
            restored = ChunkedCheckpoint.from_object_ref(ref)
            assert digest_tree(restored.to_directory(out)) == digest_tree(src)
            return
        with pytest.raises(CheckpointLostError, match="keep the process"):
            ChunkedCheckpoint.from_object_ref(ref).to_directory(out)
        assert not out.exists()
    finally:
        ray.get(gate.open.remote())
        hold_packing(agent, None)


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """What ``call()`` returned or raised (the exception itself), run on a daemon
    thread; AssertionError if it has not returned within ``seconds`` (a hang fails
    the test instead of blocking it)."""
    outcome: concurrent.futures.Future[Any] = concurrent.futures.Future()

    def run() -> None:
        try:
            outcome.set_result(call())
        except BaseException as e:
            outcome.set_result(e)

    threading.Thread(target=run, daemon=True).start()
    try:
        return outcome.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"{call} still running after {seconds} s") from None


def test_a_future_whose_ray_session_ended_fails_instead_of_hanging(
    tmp_path: Path, cluster: Any
) -> None:
    """``ray.shutdown()`` while packing is held: ``result()`` (with or without a
    timeout) raises CheckpointLostError naming the shutdown, ``exception()`` returns
    it, ``done()`` is True and a callback runs, where each waited forever on Ray's
    future of an object of a session that is over (defect: ``result()`` never
    returned). Every call runs under a deadline, so a hang fails the test."""
    src = make_checkpoint(tmp_path / "src", 12 * MiB)
    gate = Gate.remote()
    hold_packing(node_agent(node_ids()["head"]), HoldPackingAt(HOLD_AT, gate))
    called = threading.Event()
    try:
        future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(CONFIG)
        wait_until_held(gate)
        future.add_done_callback(lambda _: called.set())
        ray.shutdown()  # the gate goes with this job: packing fails in the agent
        # A waiter that never asks the future sees the session's end too.
        done, _ = concurrent.futures.wait([future], timeout=30)
        assert done == {future}
        error = within(30, future.result)
        assert isinstance(error, CheckpointLostError), error
        assert "ray.shutdown()" in str(error)
        assert isinstance(within(30, lambda: future.result(timeout=5)), CheckpointLostError)
        assert isinstance(within(30, future.exception), CheckpointLostError)
        assert within(30, future.done) is True
        assert called.wait(timeout=30)
    finally:
        if not ray.is_initialized():
            connect(cluster.address)
        hold_packing(node_agent(node_ids()["head"]), None)
