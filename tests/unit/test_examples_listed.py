"""Every script in ``examples/`` has its test in ``tests/e2e/test_examples.py``."""

from __future__ import annotations

from pathlib import Path

from tests.support.procs import REPO_ROOT

EXAMPLES = Path(REPO_ROOT) / "examples"


def test_examples_are_all_tested() -> None:
    tested = {"evaluate_each_epoch", "train_without_shared_storage", "custom_strategy", "torch_dcp"}
    assert {p.stem for p in EXAMPLES.glob("*.py")} == tested
