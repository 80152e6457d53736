"""Failures in the middle of a transfer: each leaves the target absent or untouched
(no staging left behind), raises a typed error with the Ray exception as its cause,
and never hangs. A Gate stops the reader after its first chunk, so the fault lands
mid-transfer every time, without sleeps. Incremental node storage's faults are in
``test_incremental_faults.py``."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import ray
from ray.train import Checkpoint

from air_transfer import CheckpointLostError, ChunkedCheckpoint, TransferConfig, storage_filesystem
from air_transfer.extend import register_strategy
from tests.support.checkpoints import (
    Consumer,
    MiB,
    Producer,
    digest_tree,
    kill_and_wait,
    make_checkpoint,
    on,
)
from tests.support.cluster import node_ids
from tests.support.gates import Gate, GatedSubmit, gated

pytestmark = pytest.mark.usefixtures("cluster")
CONFIG = TransferConfig(chunk_bytes=MiB, window=4, strategy="chunked")


def staging_dirs(parent: Path) -> list[str]:
    return [p for p in os.listdir(parent) if ".air-staging-" in p]


@pytest.mark.parametrize("strategy", ["chunked", "streamed"])
def test_consumer_killed_mid_write_then_retry(tmp_path: Path, strategy: str) -> None:
    src = make_checkpoint(tmp_path / "src", 8 * MiB)
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(
            config=CONFIG.replace(strategy=strategy)
        )
    )
    gate = Gate.remote()
    consumer = Consumer.options(**on("node_b")).remote()
    pid = ray.get(consumer.pid.remote())
    target = tmp_path / "out"
    pending = consumer.write.remote(gated(restored, gate), str(target))
    ray.get(gate.wait_for_arrivals.remote(1))  # first chunk written into staging
    # the staging directory, and the lock file its writer holds
    assert len(staging_dirs(tmp_path)) == 2 and not target.exists()
    kill_and_wait(consumer, pid)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(pending)
    assert not target.exists()  # never half-written

    retry = Consumer.options(**on("node_b")).remote()
    assert ray.get(retry.write.remote(restored, str(target))) == digest_tree(src)
    assert staging_dirs(tmp_path) == []  # the dead writer's staging was cleaned up
    ray.kill(retry)
    ray.kill(gate)


def test_two_consumers_writing_one_target_at_once(tmp_path: Path) -> None:
    """Two different checkpoints with the same file names, published into the same
    directory at the same moment: the result is one of them whole, never a mix."""
    first = make_checkpoint(tmp_path / "first", 6 * MiB, seed=1)
    second = make_checkpoint(tmp_path / "second", 6 * MiB, seed=2)
    expected = {"first": digest_tree(first), "second": digest_tree(second)}
    gate = Gate.remote()
    target = tmp_path / "out"
    pending = []
    for node, src in (("node_a", first), ("node_b", second)):
        ckpt = ChunkedCheckpoint.from_object_ref(
            ChunkedCheckpoint.from_directory(src).to_object_ref(config=CONFIG)
        )
        consumer = Consumer.options(**on(node)).remote()
        pending.append(consumer.write.remote(gated(ckpt, gate), str(target)))
    ray.get(gate.wait_for_arrivals.remote(2))  # both mid-write, in their own staging
    gate.open.remote()
    ray.get(pending)
    assert digest_tree(target) in (expected["first"], expected["second"])
    assert staging_dirs(tmp_path) == []
    ray.kill(gate)


def test_producer_killed_before_the_consumer_reads(tmp_path: Path) -> None:
    src = make_checkpoint(tmp_path / "src", 4 * MiB)
    caller, node = (Producer.options(**on("node_a")).remote() for _ in range(2))
    [by_caller] = ray.get(caller.share_restored.remote(str(src), CONFIG))
    [by_node] = ray.get(node.share_restored.remote(str(src), CONFIG.replace(owner="node")))
    kill_and_wait(caller)
    kill_and_wait(node)
    consumer = Consumer.options(**on("node_b")).remote()
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(consumer.write.remote(by_caller, str(tmp_path / "lost")))
    assert type(info.value.cause).__name__ == "CheckpointLostError"
    assert "owner='node'" in str(info.value.cause)
    assert not (tmp_path / "lost").exists() and staging_dirs(tmp_path) == []
    assert ray.get(consumer.write.remote(by_node, str(tmp_path / "kept"))) == digest_tree(src)
    ray.kill(consumer)


@ray.remote(num_cpus=0, max_retries=0)
def report_to_node_storage(src: str, storage_node: str, dest: str) -> tuple[str, str, str]:
    """What Ray Train's report does through ``storage_filesystem()`` on a worker
    that is not on the storage node (``train.hooks.upload_directory``, the hook on its
    persist); returns the class, the module and the message of what it raised."""
    from ray.train import Checkpoint

    from air_transfer import storage_filesystem
    from air_transfer.train.hooks import upload_directory

    fs = storage_filesystem(node=storage_node, config=CONFIG, root=os.path.dirname(dest))
    try:
        upload_directory(fs, dest, Checkpoint(src))
    except Exception as e:
        return type(e).__name__, type(e).__module__, str(e)
    return "no error", "", ""


def test_the_worker_nodes_agent_killed_mid_report_is_a_checkpoint_lost_error(
    tmp_path: Path,
) -> None:
    """The worker node's agent killed while it packs a report: the report raises
    CheckpointLostError itself, naming the agent's death (not its caller's), not
    Ray's RayTaskError(CheckpointLostError) wrapper of the storage agent's call
    (defect: node storage's agent link unwrapped only OSError and ValueError);
    nothing is stored, no staging is left."""
    from air_transfer.cluster.nodes import node_agent
    from tests.support.gates import HoldPackingAt, hold_packing

    src = make_checkpoint(tmp_path / "src", 8 * MiB)
    dest = tmp_path / "storage" / "checkpoint_000000"
    dest.parent.mkdir()
    ids = node_ids()
    agent = node_agent(ids["node_a"])
    gate = Gate.remote()
    hold_packing(agent, HoldPackingAt(4 * MiB, gate))
    try:
        report = report_to_node_storage.options(**on("node_a")).remote(
            str(src), ids["head"], str(dest)
        )
        ray.get(gate.wait_for_arrivals.remote(1), timeout=60)
        kill_and_wait(agent, ray.get(agent.pid.remote()))
        name, module, message = ray.get(report, timeout=120)
    finally:
        ray.get(gate.open.remote())
        ray.kill(gate)
    assert (name, module) == ("CheckpointLostError", "air_transfer.errors"), message
    # It names what died, an agent, and never blames the caller, which is alive
    # (depending on when the kill lands, the packing agent's death reaches the storage
    # agent's read or the reporting worker's: tests/unit/test_lost_error.py).
    assert "agent" in message and "died" in message, message
    assert "exited or the object was freed" not in message, message
    assert not dest.exists() and staging_dirs(dest.parent) == []


@pytest.mark.usefixtures("registry_restored")
def test_a_report_whose_checkpoint_is_lost_before_its_handover_is_a_checkpoint_lost_error(
    tmp_path: Path,
) -> None:
    """The node agent that relays a report's checkpoint (``to_object_ref_async``
    hands it over once its packing is submitted) killed before the handover: the
    storage node's agent cannot resolve the checkpoint it was sent, and the report
    raises CheckpointLostError (defect: Ray's RayTaskError(ActorDiedError) wrapper
    of the storage agent's call); nothing is stored, no staging is left."""
    from air_transfer.cluster.nodes import node_agent
    from air_transfer.train.hooks import upload_directory

    GatedSubmit.reset()
    register_strategy(GatedSubmit)
    src = make_checkpoint(tmp_path / "src", 2 * MiB)
    root = tmp_path / "storage"
    root.mkdir()
    ids = node_ids()
    gated = CONFIG.replace(strategy=GatedSubmit.name)
    fs = storage_filesystem(node=ids["node_a"], config=gated, root=str(root))
    outcome: list[BaseException | None] = []

    def report() -> None:
        try:
            upload_directory(fs, str(root / "checkpoint"), Checkpoint(str(src)))
            outcome.append(None)
        except BaseException as e:
            outcome.append(e)

    reporter = threading.Thread(target=report)
    reporter.start()
    try:
        assert GatedSubmit.entered.wait(timeout=60)
        agent = node_agent(ids["head"])
        kill_and_wait(agent, ray.get(agent.pid.remote()))
    finally:
        GatedSubmit.gate.set()
        reporter.join(timeout=120)
    assert not reporter.is_alive()
    [error] = outcome
    assert isinstance(error, CheckpointLostError), repr(error)
    assert "lost before it could read it" in str(error)
    assert not (root / "checkpoint").exists() and staging_dirs(root) == []
