"""Failures in the middle of a transfer: each leaves the target absent or untouched
(no staging left behind), raises a typed error with the Ray exception as its cause,
and never hangs. A Gate stops the reader after its first chunk, so the fault lands
mid-transfer every time, without sleeps.

And incremental node storage across nodes (``TransferConfig(incremental=True)``, a
report on ``node_b`` or ``node_a`` into storage on ``node_a``): only the changed
chunks are sent, each report stored bit-identical; a corrupted stored chunk is sent
again, a source changed after its checksums is a SourceChangedError reaching the
worker as itself, and a stopped Train group's report is reclaimed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray

from air_transfer import ChunkedCheckpoint, SourceChangedError, TransferConfig, storage_filesystem
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
from tests.support.gates import Gate, gated
from tests.support.incremental import (
    CHUNK,
    FILE_BYTES,
    FILES,
    INCREMENTAL_CONFIG,
    TOTAL,
    HoldAtSpan,
    make_files,
    report_changed_meanwhile,
    report_outcome,
    report_to,
    rewrite_chunk,
    storage_counters,
    storage_delta,
)
from tests.support.node_storage import read

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
    that is not on the storage node (``train.upload_directory``, the hook on its
    persist); returns the class, the module and the message of what it raised."""
    from ray.train import Checkpoint

    from air_transfer import storage_filesystem
    from air_transfer.train import upload_directory

    fs = storage_filesystem(storage_node, CONFIG)
    try:
        upload_directory(fs, dest, Checkpoint(src))
    except Exception as e:
        return type(e).__name__, type(e).__module__, str(e)
    return "no error", "", ""


def test_the_worker_nodes_agent_killed_mid_report_is_a_checkpoint_lost_error(
    tmp_path: Path,
) -> None:
    """The worker node's agent killed while it packs a report: the report raises
    CheckpointLostError itself, not Ray's RayTaskError(CheckpointLostError) wrapper
    of the storage agent's call (defect: node storage's agent link unwrapped only
    OSError and ValueError); nothing is stored, no staging is left."""
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
    assert not dest.exists() and staging_dirs(dest.parent) == []


def test_successive_reports_send_only_what_changed(tmp_path: Path) -> None:
    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    before = storage_counters()
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c1", "w"))
    assert storage_delta(before)["bytes_sent"] == TOTAL
    first = digest_tree(src)

    rewrite_chunk(src / "f1", 3)  # 1 chunk of 40 changed
    before = storage_counters()
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c2", "w"))
    cost = storage_delta(before)
    assert cost["bytes_sent"] == CHUNK and cost["bytes_reused"] == FILE_BYTES - CHUNK
    assert cost["bytes_linked"] + cost["bytes_cloned"] == TOTAL - FILE_BYTES
    assert digest_tree(root / "run/c1") == first
    assert digest_tree(root / "run/c2") == digest_tree(src)
    fs = storage_filesystem(node_ids()["node_a"], INCREMENTAL_CONFIG, root=str(root))
    assert read(fs, f"{root}/run/c2/f1") == (src / "f1").read_bytes()

    # A corrupted stored chunk (both checkpoints hold it: f2 is linked or cloned).
    with open(root / "run/c2/f2", "r+b") as f:
        f.seek(CHUNK)
        f.write(os.urandom(16))
    before = storage_counters()
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c3", "w"))
    cost = storage_delta(before)
    assert digest_tree(root / "run/c3") == digest_tree(src)
    assert cost["bytes_sent"] == CHUNK and cost["chunks_rejected"] >= 1


def test_a_source_changed_after_its_checksums_reaches_the_worker(tmp_path: Path) -> None:
    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    name, message = ray.get(
        report_changed_meanwhile.options(**on("node_b")).remote(
            str(src), str(root), f"{root}/run/c1"
        )
    )
    assert name == SourceChangedError.__name__ and "f3" in message
    assert os.listdir(root / "run") == []


def test_a_stopped_groups_incremental_report_is_reclaimed(tmp_path: Path) -> None:
    from air_transfer.train import reclaim_reports

    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c1", "w1"))
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c2", "w2"))
    fs = storage_filesystem(node_ids()["node_a"], INCREMENTAL_CONFIG, root=str(root))
    reclaim_reports(fs, ["w2"], [f"{root}/run/c1"])
    assert os.listdir(root / "run") == ["c1"]
    assert digest_tree(root / "run/c1") == digest_tree(src) and len(digest_tree(src)) == FILES + 1


def test_a_report_on_the_storage_node_reads_its_source_there(tmp_path: Path) -> None:
    """The worker on the storage node: its chunks are read from its directory by the
    storage node's agent, none crosses the object store."""
    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    ray.get(report_to.options(**on("node_a")).remote(str(src), str(root), f"{root}/run/c1"))
    rewrite_chunk(src / "sub/f0", 0)
    before = storage_counters()
    ray.get(report_to.options(**on("node_a")).remote(str(src), str(root), f"{root}/run/c2"))
    cost = storage_delta(before)
    assert cost["bytes_sent"] == CHUNK and cost["bytes_written"] == FILE_BYTES
    assert digest_tree(root / "run/c2") == digest_tree(src)


@pytest.mark.parametrize("phase", ["checksums", "send"])
def test_the_senders_agent_killed_mid_incremental_report(tmp_path: Path, phase: str) -> None:
    """The reporting node's agent killed while it takes the checksums, or while it
    packs the one changed chunk for the storage node: the report raises
    CheckpointLostError itself; nothing is stored, no staging is left, and the
    earlier checkpoint is whole."""
    from air_transfer.cluster.nodes import node_agent
    from tests.support.gates import hold_packing

    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c1"))
    rewrite_chunk(src / "f2", 1)
    agent = node_agent(node_ids()["node_b"])
    gate = Gate.remote()
    spans = FILES * 4  # every chunk is read once for its checksum, then the changed one
    hold_packing(agent, HoldAtSpan(1 if phase == "checksums" else spans + 1, gate))
    try:
        outcome = report_outcome.options(**on("node_b")).remote(
            str(src), str(root), f"{root}/run/c2"
        )
        ray.get(gate.wait_for_arrivals.remote(1), timeout=60)
        kill_and_wait(agent, ray.get(agent.pid.remote()))
        name, module, message = ray.get(outcome, timeout=120)
    finally:
        ray.get(gate.open.remote())
        ray.kill(gate)
    assert (name, module) == ("CheckpointLostError", "air_transfer.errors"), message
    assert sorted(os.listdir(root / "run")) == ["c1"]


def test_the_storage_agent_killed_mid_incremental_store(tmp_path: Path) -> None:
    """The storage node's agent killed mid-store (a report on the storage node, its
    changed chunk being read there): the report raises ConnectionError, nothing is
    published, and the next report stores whole and removes the dead store's
    staging."""
    from air_transfer.cluster.nodes import node_agent
    from tests.support.gates import hold_packing

    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    ray.get(report_to.options(**on("node_a")).remote(str(src), str(root), f"{root}/run/c1"))
    rewrite_chunk(src / "f2", 1)
    agent = node_agent(node_ids()["node_a"])
    gate = Gate.remote()
    hold_packing(agent, HoldAtSpan(FILES * 4 + 1, gate))  # past the checksums
    try:
        outcome = report_outcome.options(**on("node_a")).remote(
            str(src), str(root), f"{root}/run/c2"
        )
        ray.get(gate.wait_for_arrivals.remote(1), timeout=60)
        kill_and_wait(agent, ray.get(agent.pid.remote()))
        name, _, message = ray.get(outcome, timeout=120)
    finally:
        ray.get(gate.open.remote())
        ray.kill(gate)
    assert name == "ConnectionError", message
    assert not (root / "run/c2").exists()
    ray.get(report_to.options(**on("node_a")).remote(str(src), str(root), f"{root}/run/c2"))
    assert digest_tree(root / "run/c2") == digest_tree(src)
    assert sorted(os.listdir(root / "run")) == ["c1", "c2"]
