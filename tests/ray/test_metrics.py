"""Transfer metrics, read back the way a Ray user reads them: from the Prometheus
endpoint of the local Ray's metrics agent (``tests.support.metrics``), which must move
by exactly the bytes and chunks of each transfer."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from air_transfer import (
    CheckpointLostError,
    ChecksumError,
    ChunkedCheckpoint,
    SourceChangedError,
    TransferConfig,
    storage_filesystem,
)
from air_transfer.cluster.nodes import node_agent
from air_transfer.config import KiB
from air_transfer.extend import Manifest
from air_transfer.observe import durable_metrics, metrics, replica_metrics, telemetry
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.streams import open_reader
from air_transfer.storage.client.upload_copies import Mode, Route, Staged
from air_transfer.storage.client.uploads import NodeUpload
from air_transfer.storage.copy import copy_tree
from air_transfer.storage.node_api import NodeFiles
from tests.support.metrics import P, baseline, key, scrape, start_ray, wait_for_counts
from tests.support.rewriters import RewriteOnce, install_in_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


def _source(root: Path, sizes: list[int]) -> tuple[Path, int]:
    root.mkdir()
    for i, size in enumerate(sizes):
        (root / f"part-{i}.bin").write_bytes(os.urandom(size))
    return root, sum(sizes)


@pytest.fixture(scope="module")
def endpoint() -> Iterator[str]:
    """A local Ray for this module whose metrics agent exports every 100 ms to a
    Prometheus endpoint; its URL."""
    yield start_ray()
    ray.shutdown()


@pytest.mark.parametrize("strategy", ["inline", "chunked", "streamed"])
def test_a_transfer_moves_the_counters_by_its_bytes(
    endpoint: str, tmp_path: Path, strategy: str
) -> None:
    src, nbytes = _source(tmp_path / "src", [300 * KiB, 111 * KiB + 5, 0, 7])
    config = TransferConfig(chunk_bytes=64 * KiB, window=16, strategy=strategy)
    chunks = -(-nbytes // config.chunk_bytes)
    before = baseline(endpoint)
    ckpt = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config)
    )
    ckpt.to_directory(tmp_path / "out")
    node = ray.get_runtime_context().get_node_id()
    tags = {"strategy": strategy, "node_id": node}
    wait_for_counts(
        endpoint,
        before,
        {
            key("packed_bytes_total", **tags): nbytes,
            key("fetched_bytes_total", **tags): nbytes,
            key("written_bytes_total", **tags): nbytes,
            key("chunks_verified_total", **tags): chunks,
            key("duration_seconds_count", phase="pack", **tags): 1,
            key("duration_seconds_count", phase="read", **tags): 1,
            key("checksum_failures_total", **tags): 0,
            key("failed_transfers_total", **tags): 0,
        },
    )
    # Nothing is left in flight in the driver once both are done.
    in_flight = scrape(endpoint).get(P + "transfers_in_flight", [])
    assert all(value == 0 for labels, value in in_flight if labels["strategy"] == strategy)


def test_the_api_for_other_transfers(endpoint: str) -> None:
    """``telemetry.Transfer`` (for node storage): in flight while it runs, bytes
    counted by phase, a duration when it ends, a failure with its error's class."""
    before = baseline(endpoint)
    upload = telemetry.Transfer("upload", strategy="test-api", total=10, desc="upload x").start()
    upload.advance(6)
    upload.advance(4)
    wait_for_counts(
        endpoint,
        before,
        {
            key("transfers_in_flight", phase="upload", strategy="test-api"): 1,
            key("written_bytes_total", strategy="test-api"): 10,
        },
    )
    upload.finish()
    upload.finish()  # only the first call counts

    def download_chunks() -> Iterator[bytes]:
        with telemetry.Transfer("download", strategy="test-api", total=9, desc="x") as t:
            for _ in range(3):
                t.advance(3)
                yield b"abc"

    chunks = download_chunks()
    next(chunks)
    chunks.close()  # a reader that stopped early: no failure
    with (
        pytest.raises(OSError),
        telemetry.Transfer("download", strategy="test-api", total=None, desc="read x") as download,
    ):
        download.advance(3)
        raise OSError("disk gone")
    wait_for_counts(
        endpoint,
        before,
        {
            key("transfers_in_flight", phase="upload", strategy="test-api"): 0,
            key("transfers_in_flight", phase="download", strategy="test-api"): 0,
            key("duration_seconds_count", phase="upload", strategy="test-api"): 1,
            key("duration_seconds_count", phase="download", strategy="test-api"): 1,
            key("fetched_bytes_total", strategy="test-api"): 6,
            key(
                "failed_transfers_total", phase="download", strategy="test-api", error="OSError"
            ): 1,
        },
    )


def test_checksum_failures_counted(endpoint: str, tmp_path: Path) -> None:
    src, _ = _source(tmp_path / "src", [256 * KiB])
    config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked")
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config)
    )
    handle = restored.handle().complete()
    sums = list(handle.manifest.chunks or ())
    sums[2] = "0" * 32
    bad = Manifest(handle.manifest.entries, handle.manifest.chunk_bytes, tuple(sums))
    corrupt = ChunkedCheckpoint._from_handle(dataclasses.replace(handle, manifest=bad))
    before = baseline(endpoint)
    with pytest.raises(ChecksumError):
        corrupt.to_directory(tmp_path / "out")
    with pytest.raises(ChecksumError), corrupt.open("part-0.bin") as f:
        f.read()
    wait_for_counts(
        endpoint,
        before,
        {
            key("checksum_failures_total", strategy="chunked"): 2,
            key("chunks_verified_total", strategy="chunked"): 4,  # 0 and 1, twice
            key("failed_transfers_total", phase="read", error="ChecksumError"): 1,
            key("duration_seconds_count", phase="read", strategy="chunked"): 0,
        },
    )


def test_failed_packing_counted_with_its_error(endpoint: str, tmp_path: Path) -> None:
    """A source rewritten while the agent packs it: the packing's failure is counted
    by the error packing raised (not Ray's wrapper), and no duration is observed."""
    src, _ = _source(tmp_path / "src", [256 * KiB])
    config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked")
    agent = node_agent()
    install_in_agent(agent, RewriteOnce("part-0.bin", offset=64 * KiB))
    before = baseline(endpoint)
    try:
        with pytest.raises(SourceChangedError):
            ChunkedCheckpoint.from_directory(src).to_object_ref(config)
    finally:
        install_in_agent(agent, None)
    wait_for_counts(
        endpoint,
        before,
        {
            key(
                "failed_transfers_total",
                phase="pack",
                strategy="chunked",
                error="SourceChangedError",
            ): 1,
            key("duration_seconds_count", phase="pack", strategy="chunked"): 0,
        },
    )


@ray.remote(num_cpus=0)
class _Producer:
    """Packs a checkpoint (owning its chunks) and can then be killed."""

    def share(self, path: str, config: TransferConfig) -> ChunkedCheckpoint:
        self.ref = ChunkedCheckpoint.from_directory(path).to_object_ref(config)
        return ChunkedCheckpoint.from_object_ref(self.ref)


def test_lost_transfers_counted(endpoint: str, tmp_path: Path) -> None:
    src, _ = _source(tmp_path / "src", [512 * KiB])
    config = TransferConfig(chunk_bytes=256 * KiB, window=8, strategy="chunked")
    producer = _Producer.remote()
    restored = ray.get(producer.share.remote(str(src), config))
    before = baseline(endpoint)
    ray.kill(producer)

    def lost() -> bool:  # Ray frees a dead owner's objects within a second or two
        try:
            restored.to_directory(tmp_path / "out")
        except CheckpointLostError:
            return True
        shutil.rmtree(tmp_path / "out")
        return False

    eventually(lost, "the chunks of a dead owner to become unreadable", timeout_s=60)
    wait_for_counts(
        endpoint,
        before,
        {
            key("lost_transfers_total", strategy="chunked"): 1,
            key("failed_transfers_total", phase="read", error="CheckpointLostError"): 1,
        },
    )


def test_the_drain_and_the_replicas_record_through_the_same_metrics(endpoint: str) -> None:
    """The durable tier's and the replicas' metrics are made and exported as the
    transfers' are (one factory, ``metrics.Metric``)."""
    before = baseline(endpoint)
    durable_metrics.uploaded(7)
    durable_metrics.upload_error("OSError")
    durable_metrics.lag(5)
    replica_metrics.degraded_write()
    replica_metrics.under_replicated(9)
    wait_for_counts(
        endpoint,
        before,
        {
            key("durable_uploaded_bytes_total"): 7,
            key("durable_upload_errors_total", error="OSError"): 1,
            key("durable_lag_bytes"): 5,
            key("degraded_writes_total"): 1,
            key("under_replicated_bytes"): 9,
        },
    )


def test_metrics_off_makes_nothing(
    endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AIR_TRANSFER_METRICS=0``: no metric object is made and nothing recorded."""
    monkeypatch.setenv(metrics.ENV_VAR, "0")
    for metric in metrics.Metric.declared:
        monkeypatch.setattr(metric, "_made", None)
    recorded: list[object] = []
    monkeypatch.setattr(metrics.Metric, "_apply", lambda *args: recorded.append(args))
    src, _ = _source(tmp_path / "src", [256 * KiB])
    config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked")
    ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config)
    ).to_directory(tmp_path / "out")
    assert ([m for m in metrics.Metric.declared if m._made is not None], recorded) == ([], [])


def test_node_storage_counts_what_it_moves(endpoint: str, tmp_path: Path) -> None:
    """Node storage's own transfers (strategy ``node-storage``): a file written on
    the storage node (``upload``), a file written and read over the wire to the
    agent (``upload``, ``download``), a Train copy on the storage node, and a write
    that failed; each byte counted once, in flight back to zero."""
    config = TransferConfig(chunk_bytes=64 * KiB, window=4)
    fs = storage_filesystem(config=config, root=str(tmp_path))
    handler = node_storage_handler(fs)
    assert handler is not None
    node = ray.get_runtime_context().get_node_id()
    tags = {"strategy": "node-storage", "node_id": node}
    here = os.urandom(300 * KiB + 3)
    wire = os.urandom(200 * KiB + 9)
    src, tree = _source(tmp_path / "src", [130 * KiB, 5])
    before = baseline(endpoint)

    with fs.open_output_stream(str(tmp_path / "here.bin")) as f:  # on the storage node
        for i in range(0, len(here), 1000):
            f.write(here[i : i + 1000])
    local = str(tmp_path / "wire.bin")  # over the wire, to this node's own agent
    staging, start, expect = handler.link.call(NodeFiles.fs_open_write, handler.root, local, False)
    sent = Mode(Route.SEND, direct_io=config.direct_io)
    copy = Staged(node, handler.link, local, staging, start, expect)
    writer = NodeUpload(sent, [copy], config, local, handler._upload(local))
    writer.write(wire)
    writer.close()
    with open_reader(handler.link, local, local, len(wire)) as reader:
        assert reader.read() == wire
    copy_tree(str(src), str(tmp_path / "copied"), config, "upload")
    bad = str(tmp_path / "bad.bin")  # dropped unclosed (copy_files whose source failed)
    staging, start, expect = handler.link.call(NodeFiles.fs_open_write, handler.root, bad, False)
    direct = Mode(Route.HERE, direct_io=config.direct_io)
    copy = Staged(node, handler.link, bad, staging, start, expect)
    dropped = NodeUpload(direct, [copy], config, bad, handler._upload(bad))
    dropped.write(b"x" * 100)
    del dropped

    assert (tmp_path / "here.bin").read_bytes() == here
    assert not (tmp_path / "bad.bin").exists()
    wait_for_counts(
        endpoint,
        before,
        {
            key("written_bytes_total", **tags): len(here) + len(wire) + tree,
            key("fetched_bytes_total", **tags): len(wire),
            key("chunks_verified_total", **tags): -(-len(wire) // (128 * KiB)),
            key("duration_seconds_count", phase="upload", **tags): 3,
            key("duration_seconds_count", phase="download", **tags): 1,
            key("transfers_in_flight", phase="upload", **tags): 0,
            key("transfers_in_flight", phase="download", **tags): 0,
            key("failed_transfers_total", phase="upload", error="OSError", **tags): 1,
        },
    )


def test_metrics_follow_a_new_ray_session(endpoint: str, tmp_path: Path) -> None:
    """Regression: the node id was cached per process, so after ``ray.shutdown()``
    and ``ray.init()`` (a notebook, a test suite) the driver tagged its metrics with
    the node of the first session, and the new node's series never moved."""
    telemetry.Transfer("upload", strategy="old-session", total=1, desc="x").start().finish()
    url = start_ray()  # keep this test last: the fixture's URL is the first session's
    try:
        src, nbytes = _source(tmp_path / "src", [200 * KiB])
        config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked")
        before = baseline(url)
        ChunkedCheckpoint.from_object_ref(
            ChunkedCheckpoint.from_directory(src).to_object_ref(config)
        ).to_directory(tmp_path / "out")
        tags = {"strategy": "chunked", "node_id": ray.get_runtime_context().get_node_id()}
        wait_for_counts(
            url,
            before,
            {
                key("fetched_bytes_total", **tags): nbytes,
                key("written_bytes_total", **tags): nbytes,
                key("duration_seconds_count", phase="read", **tags): 1,
            },
        )
    finally:
        ray.shutdown()
