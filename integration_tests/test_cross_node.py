"""Checkpoints packed on one node and rebuilt on another, through the object store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray

from air_transfer import ChunkedCheckpoint, TransferConfig

pytestmark = pytest.mark.usefixtures("two_node_cluster")
KiB = 1024


def make_checkpoint(root: Path) -> dict[str, bytes]:
    files = {
        "model.bin": os.urandom(3 * 1024 * KiB + 123),
        "optim/state.pt": os.urandom(700 * KiB),
        "tokenizer/vocab ü.json": b'{"a": 1}',
        "empty": b"",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


@ray.remote(num_cpus=0, resources={"node_a": 0.01})
def produce(src: str, config: TransferConfig) -> tuple[str, list]:
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=config)
    # The chunks die with their owner; this task's worker stays alive in the pool
    # only as long as Ray keeps it, so hand back the restored checkpoint, whose
    # refs the driver then borrows.
    return ray.get_runtime_context().get_node_id(), [ChunkedCheckpoint.from_object_ref(ref)]


@ray.remote(num_cpus=0, resources={"node_b": 0.01})
def consume(ckpt: ChunkedCheckpoint, target: str) -> tuple[str, dict[str, bytes]]:
    out = Path(ckpt.to_directory(target))
    files = {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    return ray.get_runtime_context().get_node_id(), files


@pytest.mark.parametrize("strategy", ["inline", "chunked"])
def test_produced_on_one_node_rebuilt_on_another(tmp_path: Path, strategy: str) -> None:
    expected = make_checkpoint(tmp_path / "src")
    config = TransferConfig(chunk_bytes=256 * KiB, window=32, strategy=strategy)
    producer_node, (restored,) = ray.get(produce.remote(str(tmp_path / "src"), config))
    consumer_node, files = ray.get(consume.remote(restored, str(tmp_path / "out")))
    assert producer_node != consumer_node
    assert files == expected
