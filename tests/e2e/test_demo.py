"""``python -m benchmarks demo``: a small run in a subprocess (its own two-node mock
cluster), checked by its output and by what it left in the storage directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT, child_env

# Each test runs a bench (or the demo) with its own Ray: the shared one is stopped.
pytestmark = pytest.mark.usefixtures("no_ray")


def test_demo_reports_checkpoints_to_the_driver_node_and_restores_them(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    cmd = [
        sys.executable, "-m", "benchmarks", "demo", "--size-mb", "6", "--reports", "3",
        "--workers", "1", "--chunk-mb", "1", "--storage", str(storage),
    ]  # fmt: skip
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, f"demo failed:\n{proc.stdout}\n{proc.stderr}"
    out = proc.stdout
    assert out.count("upload") == 3 and out.count("(deleted: num_to_keep)") == 1, out
    assert "restore on the worker node" in out and "bytes identical everywhere" in out, out
    kept = sorted(p for p in (storage / "demo").iterdir() if p.is_dir())
    assert len(kept) == 2
    for checkpoint in kept:
        assert str(checkpoint) in out
        assert (checkpoint / "model-rank0.bin").stat().st_size == 6 * 1024 * 1024
