"""Metrics recorded in a process without a Ray session make no Ray session (no Ray)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from air_transfer.config import KiB
from tests.support.procs import REPO_ROOT, child_env


def _source(root: Path, sizes: list[int]) -> tuple[Path, int]:
    root.mkdir()
    for i, size in enumerate(sizes):
        (root / f"part-{i}.bin").write_bytes(os.urandom(size))
    return root, sum(sizes)


def test_recording_outside_ray_never_starts_ray(tmp_path: Path) -> None:
    """Regression: a transfer recorded in a process without a Ray session (a Train
    copy through ``copy.copy_tree`` in a plain script) started a local Ray
    instance to make its metrics. A subprocess: a fresh interpreter, with no Ray
    this test process might have."""
    src, _ = _source(tmp_path / "src", [100 * KiB])
    code = f"""
import ray
from air_transfer import TransferConfig
from air_transfer.observe import telemetry
from air_transfer.storage.copy import copy_tree
copy_tree({str(src)!r}, {str(tmp_path / "out")!r}, TransferConfig(), "upload")
telemetry.Transfer("read", strategy="x", total=1, desc="x").start().finish()
assert not ray.is_initialized(), "Ray was started"
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr
    assert (tmp_path / "out" / "part-0.bin").read_bytes() == (src / "part-0.bin").read_bytes()
