"""The scripts in ``examples/`` run, at small size, and do what they say: each
``main()`` is imported and run, and what it returns is checked, so an API change
that breaks an example fails here instead of in a user's hands."""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from types import ModuleType

import pytest
import ray

from air_transfer.config import KiB, MiB
from tests.support.procs import REPO_ROOT

EXAMPLES = Path(REPO_ROOT) / "examples"


def load(name: str) -> ModuleType:
    """``examples/<name>.py`` imported by path (``examples/`` is not a package). It is
    not put in ``sys.modules``: Ray then pickles its functions and classes by value,
    as it does those of a script run as ``__main__``, so workers need not import it."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# First: it starts (and stops) its own two-node cluster, so no Ray may be running.
def test_train_without_shared_storage_resumes_after_a_failure(tmp_path: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()
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


# Also before any ray_local test: it starts its own three-node cluster.
def test_torch_dcp_resumes_after_a_failure(tmp_path: Path) -> None:
    if ray.is_initialized():
        ray.shutdown()
    storage = tmp_path / "storage"
    out = load("torch_dcp").main(steps=3, width=128, storage_path=str(storage))
    assert out["step"] == 2
    assert out["resumed_from"] == 2, "the run did not resume after the checkpoint of step 1"
    assert out["node"] != out["driver_node"], "the worker ran on the driver's node"
    assert out["checkpoint_files"] == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert out["loaded_step"] == 2 and out["loaded_model_matches"]
    assert Path(out["checkpoint_path"]).is_relative_to(storage)
    assert not ray.is_initialized(), "main() left the cluster it started running"


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("use_async", [False, True], ids=["to_object_ref", "async"])
def test_evaluate_each_epoch(
    use_async: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where epochs are written
    rows = load("evaluate_each_epoch").main(
        epochs=3, size_bytes=3 * MiB + 4, chunk_bytes=MiB, use_async=use_async
    )
    assert [row["epoch"] for row in rows] == [0, 1, 2]
    for row in rows:
        assert row["score"] == row["expected_score"], row
    assert list(tmp_path.iterdir()) == [], "an epoch's directory was left behind"
    assert ray.is_initialized(), "main() stopped the Ray it was given"


@pytest.mark.usefixtures("ray_local", "registry_restored")
def test_custom_strategy_is_selected_by_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    out = load("custom_strategy").main(
        small_bytes=64 * KiB, large_bytes=3 * MiB, select_above_bytes=MiB, chunk_bytes=MiB
    )
    assert out == {
        "small": {"strategy": "inline", "identical": True},
        "large": {"strategy": "zlib", "identical": True},
    }
    assert list(tmp_path.iterdir()) == []
