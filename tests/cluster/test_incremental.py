"""Incremental node storage across nodes of the mock cluster: a Ray Train report
made on ``node_b`` into node storage on ``node_a`` (``upload_directory``, the hook of
``storage_filesystem(config=TransferConfig(incremental=True))``) sends only the
chunks ``node_a`` does not hold, packed by ``node_b``'s agent; each report is stored
bit-identical and read back through the filesystem; a corrupted stored chunk is
sent again; a source changed after its checksums is a SourceChangedError reaching
the worker as itself; a report of a stopped Train group is reclaimed."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import ray

from air_transfer import SourceChangedError, TransferConfig, node_agent, storage_filesystem
from tests.support.checkpoints import digest_tree, on
from tests.support.cluster import node_ids
from tests.support.incremental import CHUNK, FILE_BYTES, FILES, TOTAL, make_files, rewrite_chunk
from tests.support.node_storage import read

pytestmark = pytest.mark.usefixtures("cluster")

CONFIG = TransferConfig(chunk_bytes=CHUNK, window=2, incremental=True)


@ray.remote(num_cpus=0, max_retries=0)
def report(src: str, root: str, dest: str, worker: str = "") -> None:
    """What Ray Train's report does on a worker of ``node_b`` (``upload_directory``)."""
    from ray.train import Checkpoint

    from air_transfer.train import upload_directory

    fs = storage_filesystem(node_ids()["node_a"], CONFIG, root=root)
    upload_directory(fs, dest, Checkpoint(src), worker)


@ray.remote(num_cpus=0, max_retries=0)
def report_changed_meanwhile(src: str, root: str, dest: str) -> tuple[str, str]:
    """A report whose file ``f3`` changes after its checksums were taken; what the
    worker got (the class and message of the error)."""
    from air_transfer.storage.client.incremental import chunked_files
    from air_transfer.storage.client.streams import AgentLink

    link = AgentLink(node_ids()["node_a"], root, CONFIG)
    described = chunked_files(src, CHUNK)
    assert described is not None
    source, files = described
    rewrite_chunk(Path(src) / "f3", 0)
    node = ray.get_runtime_context().get_node_id()
    try:
        link.call(lambda a: a.store_incremental(None, root, dest, source, node, files, CONFIG))
    except Exception as e:
        return type(e).__name__, str(e)
    return "no error", ""


def counters() -> dict[str, int]:
    found: dict[str, int] = ray.get(node_agent(node_ids()["node_a"]).incremental_counters.remote())
    return found


def delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in counters().items()}


def test_successive_reports_send_only_what_changed(tmp_path: Path) -> None:
    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    before = counters()
    ray.get(report.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c1", "w"))
    assert delta(before)["bytes_sent"] == TOTAL
    first = digest_tree(src)

    rewrite_chunk(src / "f1", 3)  # 1 chunk of 40 changed
    before = counters()
    ray.get(report.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c2", "w"))
    cost = delta(before)
    assert cost["bytes_sent"] == CHUNK and cost["bytes_reused"] == FILE_BYTES - CHUNK
    assert cost["bytes_linked"] + cost["bytes_cloned"] == TOTAL - FILE_BYTES
    assert digest_tree(root / "run/c1") == first
    assert digest_tree(root / "run/c2") == digest_tree(src)
    fs = storage_filesystem(node_ids()["node_a"], CONFIG, root=str(root))
    assert read(fs, f"{root}/run/c2/f1") == (src / "f1").read_bytes()

    # A corrupted stored chunk (both checkpoints hold it: f2 is linked or cloned).
    with open(root / "run/c2/f2", "r+b") as f:
        f.seek(CHUNK)
        f.write(os.urandom(16))
    before = counters()
    ray.get(report.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c3", "w"))
    cost = delta(before)
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
    ray.get(report.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c1", "w1"))
    ray.get(report.options(**on("node_b")).remote(str(src), str(root), f"{root}/run/c2", "w2"))
    fs: Any = storage_filesystem(node_ids()["node_a"], CONFIG, root=str(root))
    reclaim_reports(fs, ["w2"], [f"{root}/run/c1"])
    assert os.listdir(root / "run") == ["c1"]
    assert digest_tree(root / "run/c1") == digest_tree(src) and len(digest_tree(src)) == FILES + 1


def test_a_report_on_the_storage_node_reads_its_source_there(tmp_path: Path) -> None:
    """The worker on the storage node: its chunks are read from its directory by the
    storage node's agent, none crosses the object store."""
    root, src = tmp_path / "root", make_files(tmp_path / "src")
    (root / "run").mkdir(parents=True)
    ray.get(report.options(**on("node_a")).remote(str(src), str(root), f"{root}/run/c1"))
    rewrite_chunk(src / "sub/f0", 0)
    before = counters()
    ray.get(report.options(**on("node_a")).remote(str(src), str(root), f"{root}/run/c2"))
    cost = delta(before)
    assert cost["bytes_sent"] == CHUNK and cost["bytes_written"] == FILE_BYTES
    assert digest_tree(root / "run/c2") == digest_tree(src)
