"""A Ray Train run into ``placement="writer"`` node storage loses, after it ends, a node
one of its ranks wrote from (its shards' first holder, as a spot instance is taken
back): a new run of the same name resumes on the nodes left from the latest
checkpoint, and every rank reads back every shard bit-identical, the lost node's
from the holder that kept its second copy."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.train
from ray.cluster_utils import Cluster
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import storage_filesystem
from tests.support.checkpoints import MiB, digest_tree
from tests.support.cluster import STORE_BYTES, node_ids
from tests.support.replicas import remove
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

SHARD = 2 * MiB + 3
STEPS = 2
#: What only the first run's ranks ask for: two nodes of their own, one to lose.
RANK_NODE = "writer_rank"


def loop(config: dict[str, Any]) -> None:
    """With no checkpoint: each step, every rank stores its shard (rank 0 also the
    step) and notes the digests of its report once it returned. Resumed: every rank
    reads the whole checkpoint back and notes its digests and its node."""
    out, rank = Path(config["out"]), ray.train.get_context().get_world_rank()
    node = ray.get_runtime_context().get_node_id()
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        d = checkpoint.to_directory(tempfile.mkdtemp(prefix="restore-"))
        (out / f"restored-{rank}").write_text(json.dumps([node, digest_tree(d)]))
        shutil.rmtree(d)
        return
    for step in range(STEPS):
        d = Path(tempfile.mkdtemp(prefix=f"step{step}-{rank}-"))
        (d / f"shard-{rank}.bin").write_bytes(os.urandom(SHARD))
        if rank == 0:
            (d / "state.json").write_text(json.dumps({"step": step}))
        digests = digest_tree(d)
        ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(str(d)))
        shutil.rmtree(d)
        (out / f"returned-{step}-{rank}").write_text(json.dumps([node, digests]))


def _fit(out: Path, fs: Any, storage: str, resources: dict[str, float]) -> ray.train.Result:
    return DataParallelTrainer(
        loop,
        train_loop_config={"out": str(out)},
        scaling_config=ray.train.ScalingConfig(num_workers=2, resources_per_worker=resources),
        run_config=ray.train.RunConfig(
            name="run",
            storage_path=storage,
            storage_filesystem=fs,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2),
        ),
    ).fit()


def test_a_run_resumes_bit_identical_after_a_writer_node_is_lost(
    replica_cluster: Cluster, tmp_path: Path
) -> None:
    added = []
    for i in range(2):
        name = f"node_rank{i}"
        added.append(name)
        replica_cluster.add_node(
            num_cpus=1, resources={name: 1.0, RANK_NODE: 1.0}, object_store_memory=STORE_BYTES
        )
    replica_cluster.wait_for_nodes()
    eventually(lambda: set(added) <= set(node_ids()), "the ranks' nodes alive")
    ids = node_ids()
    fs = storage_filesystem(
        node=ids["head"],
        root=str(tmp_path / "copies" / ids["head"]),
        replicas=2,
        replica_root=str(tmp_path / "copies" / "{node_id}"),
        placement="writer",
    )
    storage = str(tmp_path / "copies" / ids["head"] / "runs")
    out = tmp_path / "out"
    out.mkdir()
    try:
        _fit(out, fs, storage, {"CPU": 1, RANK_NODE: 1})
        last = {
            rank: json.loads((out / f"returned-{STEPS - 1}-{rank}").read_text()) for rank in (0, 1)
        }
        expected = {**last[0][1], **last[1][1]}
        assert set(expected) == {"shard-0.bin", "shard-1.bin", "state.json"}
        lost = last[1][0]  # rank 1's node: the first holder of rank 1's shards
        assert lost in {ids[n] for n in added}
        held = digest_tree(tmp_path / "copies" / f"{lost}.placed")
        assert expected["shard-1.bin"] in held.values(), "the lost node held no shard of its rank"
        remove(replica_cluster, lost)
        _fit(out, fs, storage, {"CPU": 1})
        for rank in (0, 1):
            node, restored = json.loads((out / f"restored-{rank}").read_text())
            assert node != lost
            assert restored == expected, f"rank {rank} read back other bytes"
    finally:
        live = node_ids()
        for name in added:
            if name in live:
                remove(replica_cluster, live[name])
