"""The scripts in ``examples/`` run, at small size, and do what they say: each
``main()`` is imported and run, and what it returns is checked, so an API change
that breaks an example fails here instead of in a user's hands; on the cluster the
end-to-end tier shares (an example uses the Ray it is given, as in a notebook). The
two that start a cluster of their own: ``test_example_train.py``,
``test_example_dcp.py``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import ray

from air_transfer.config import KiB, MiB
from tests.support.examples import load


@pytest.mark.usefixtures("cluster")
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


@pytest.mark.usefixtures("cluster", "registry_restored")
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
