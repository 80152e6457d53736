"""``examples/train_without_shared_storage.py`` at small size: a Train run on the
two-node cluster it starts, resuming after a failure from a checkpoint on the driver's
node."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from air_transfer.config import MiB
from tests.support.examples import load

pytestmark = pytest.mark.usefixtures("no_ray")  # main() starts a cluster of its own


def test_train_without_shared_storage_resumes_after_a_failure(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    out = load("train_without_shared_storage").main(
        epochs=3, size_bytes=2 * MiB + 12, chunk_bytes=MiB, storage_path=str(storage)
    )
    assert out["epoch"] == 2
    assert out["resumed_from"] == 0, "the run did not resume from its first checkpoint"
    assert out["node"] != out["driver_node"], "the worker ran on the driver's node"
    assert out["restored_on_driver_matches"]
    # The checkpoint landed on the driver node's disk, under the storage path.
    checkpoint = Path(out["checkpoint_path"])
    assert checkpoint.is_relative_to(storage) and (checkpoint / "weights.bin").is_file()
    assert not ray.is_initialized(), "main() left the cluster it started running"
