"""Incremental node storage across nodes (``TransferConfig(incremental=True)``, a
report on ``node_b`` or ``node_a`` into storage on ``node_a``): only the changed
chunks are sent, each report stored bit-identical; a corrupted stored chunk is sent
again, a source changed after its checksums is a SourceChangedError reaching the
worker as itself, a stopped Train group's report is reclaimed, and an agent killed
in each phase leaves nothing published."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray

from air_transfer import (
    SourceChangedError,
    TransferConfig,
    storage_filesystem,
)
from tests.support.checkpoints import (
    MiB,
    digest_tree,
    kill_and_wait,
    on,
)
from tests.support.cluster import node_ids
from tests.support.gates import Gate
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
    fs = storage_filesystem(node=node_ids()["node_a"], config=INCREMENTAL_CONFIG, root=str(root))
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
    from air_transfer.train.hooks import reclaim_reports

    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c1", "w1"))
    ray.get(report_to.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c2", "w2"))
    fs = storage_filesystem(node=node_ids()["node_a"], config=INCREMENTAL_CONFIG, root=str(root))
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
