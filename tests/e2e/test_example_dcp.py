"""``examples/torch_dcp.py`` at small size: torch DCP through node storage, resuming
after a failure, on the cluster the tier shares, whose worker nodes offer the
resource the example puts its workers on (``tests.support.cluster``). Starting a
cluster of its own is what ``test_example_train.py`` runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from tests.support.examples import load

pytestmark = pytest.mark.usefixtures("cluster")


def test_torch_dcp_resumes_after_a_failure(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    out = load("torch_dcp").main(steps=3, width=128, storage_path=str(storage))
    assert out["step"] == 2
    assert out["resumed_from"] == 2, "the run did not resume after the checkpoint of step 1"
    assert out["node"] != out["driver_node"], "the worker ran on the driver's node"
    assert out["checkpoint_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert out["loaded_step"] == 2 and out["loaded_model_matches"]
    assert Path(out["checkpoint_path"]).is_relative_to(storage)
    assert ray.is_initialized(), "main() stopped the Ray it was given"
