"""A Ray Train run (``TorchTrainer``, gloo, two ranks on two nodes) into node storage
with ``placement="writer"``: each rank stores its shard of every step, the shards'
bytes stay on the ranks' nodes (and one other each), never on the storage node; a
rank killed right after its report of step 1 returned, the restart restores step 1
bit-identical, and Train's pruning takes the holders' bytes with the checkpoints.
DDP's way (rank 0 alone reports) has one writer, whose node keeps every checkpoint."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray.train
from ray.cluster_utils import Cluster
from ray.train.torch import TorchTrainer

import air_transfer
from air_transfer.cluster.nodes import node_agent
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.view import TierView
from air_transfer.storage.placed_record import SUMS_SUFFIX
from tests.support.checkpoints import MiB
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.s3 import S3Server, bucket_server
from tests.support.train_commit import NUM_TO_KEEP, SHARD, resumed_from, returned, sharded_loop
from tests.support.train_failures import (
    SMALL_SIZE,
    assert_resumed_from_last_returned_report,
    fit,
    trainer_cluster,
)


@pytest.fixture(scope="module", autouse=True)
def cluster() -> Iterator[Cluster]:
    yield from trainer_cluster()


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "runs")


def _placed_bytes(copies: Path) -> int:
    """The bytes of the blobs under every placed root (not the checksums beside each)."""
    return sum(
        os.path.getsize(os.path.join(base, f))
        for entry in os.listdir(copies)
        if entry.endswith(".placed")
        for base, _, files in os.walk(copies / entry)
        for f in files
        if not f.endswith(SUMS_SUFFIX)
    )


def _placed(copies: Path, **storage: Any) -> tuple[pafs.FileSystem, WriterPlacedHandler]:
    """Writer-placed node storage on the head node, its copies under ``copies``."""
    head = node_ids()["head"]
    fs = air_transfer.storage_filesystem(
        node=head,
        config=air_transfer.TransferConfig(chunk_bytes=MiB, window=4),
        root=str(copies / head),
        replicas=2,
        replica_root=str(copies / "{node_id}"),
        placement="writer",
        **storage,
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, WriterPlacedHandler)
    return fs, handler


def _sharded_run(tmp_path: Path, fs: pafs.FileSystem, root: str) -> ray.train.Result:
    """Two ranks each reporting a shard, rank 1 killed right after its report of
    step 1 (``tests.support.train_commit``), into ``fs`` under ``root``."""
    (tmp_path / "returned").mkdir()
    return TorchTrainer(
        sharded_loop,
        train_loop_config={"out": str(tmp_path), "kill_rank": 1, "kill_after": 1},
        scaling_config=ray.train.ScalingConfig(
            num_workers=2, resources_per_worker={"CPU": 1, "trainer": 1}
        ),
        run_config=ray.train.RunConfig(
            name="run",
            storage_path=f"{root}/storage",
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=NUM_TO_KEEP),
            failure_config=ray.train.FailureConfig(max_failures=1),
        ),
    ).fit()


def test_a_train_run_restores_shards_kept_where_they_were_written(tmp_path: Path) -> None:
    copies = tmp_path / "copies"
    fs, handler = _placed(copies)
    result = _sharded_run(tmp_path, fs, handler.root)
    step_1 = returned(tmp_path, 1)
    assert step_1 is not None and set(step_1) == {"shard-0.bin", "shard-1.bin", "state.json"}
    assert resumed_from(result) == (1, step_1)
    # What Train keeps: 2 checkpoints of 2 shards, each shard on 2 holders; the
    # storage node's root has a stub of each, not its bytes.
    kept = [c for c, _ in result.best_checkpoints]
    assert len(kept) == NUM_TO_KEEP
    shards = [f"{c.path}/shard-{r}.bin" for c in kept for r in (0, 1)]
    assert [fs.get_file_info(s).size for s in shards] == [SHARD] * len(shards)
    assert _placed_bytes(copies) == 2 * SHARD * len(shards)
    stored = sum(
        os.stat(os.path.join(b, f)).st_blocks * 512
        for b, _, files in os.walk(handler.root)
        for f in files
    )
    assert stored < SHARD // 2


def test_rank_0_alone_reporting_keeps_its_checkpoints_on_its_node(tmp_path: Path) -> None:
    """Rank 0 reports every step and fails right after step 1's report: the run
    resumes from the last report that returned, read back byte for byte, and every
    kept checkpoint's large file has rank 0's node as its first holder."""
    copies = tmp_path.parent / f"{tmp_path.name}-copies"
    fs = air_transfer.storage_filesystem(
        node=node_ids()["head"],
        root=str(tmp_path),
        replicas=2,
        replica_root=str(copies / "{node_id}"),
        placement="writer",
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, WriterPlacedHandler)
    result = fit(tmp_path, fs, fail_rank=0, size=SMALL_SIZE)
    assert_resumed_from_last_returned_report(result, tmp_path)
    workers = {node_ids()[n] for n in ("node_a", "node_b")}  # where Train's ranks run
    for checkpoint, _ in result.best_checkpoints:
        large = [
            f for f in fs.get_file_info(pafs.FileSelector(checkpoint.path)) if (f.size or 0) >= MiB
        ]
        assert large, checkpoint.path
        for info in large:
            record = handler.record_of(info.path)
            assert record is not None and record.holders[0][0] in workers, info.path
    stored = sum(
        os.stat(os.path.join(b, f)).st_blocks * 512 for b, _, fs_ in os.walk(tmp_path) for f in fs_
    )
    assert stored < SMALL_SIZE // 2


def test_each_rank_drains_its_own_shards_and_the_tier_holds_what_train_keeps(
    s3: S3Server, tmp_path: Path
) -> None:
    """A worker fails right after its report of step 1 and the run resumes from it; the
    bucket then holds every file of the kept checkpoints bit-identical, each shard
    sent by a node of Train's ranks, none by the storage node, and read back by the
    tier's manifests, every chunk checked."""
    head = node_ids()["head"]
    fs, handler = _placed(tmp_path / "copies", durable=s3.uri("runs", "placed"))
    before = {n: _sent(n) for n in node_ids().values()}
    result = _sharded_run(tmp_path, fs, handler.root)
    step_1 = returned(tmp_path, 1)
    assert step_1 is not None and resumed_from(result) == (1, step_1)
    air_transfer.wait_durable(fs, timeout=180)
    tier = pafs.PyFileSystem(TierView(DurableTarget.parse((s3.filesystem(), "runs/placed"))))
    kept = [c for c, _ in result.best_checkpoints]
    shards = 0
    for checkpoint in kept:
        rel = checkpoint.path[len(handler.root) + 1 :]
        for info in fs.get_file_info(pafs.FileSelector(checkpoint.path)):
            name = f"runs/placed/{rel}/{info.base_name}"
            assert read(tier, name) == read(fs, info.path), name  # by the manifests, checked
            shards += info.base_name.startswith("shard-")
    assert shards == 2 * len(kept)
    sent = {n: _sent(n) - before[n] for n in node_ids().values()}
    assert sent[head] == 0  # the storage node: no shard's bytes went through it
    assert sum(sent.values()) >= shards * SHARD  # the ranks' nodes sent them


def _sent(node: str) -> int:
    """Bytes of placed files ``node``'s agent sent to a durable tier."""
    counters: dict[str, int] = ray.get(node_agent(node).read_counters.remote())
    return counters["placed_bytes_sent"]
