"""Running ``python -m benchmarks bench`` from a test: a subprocess with its own Ray,
the tiny sizes the smoke tests use, and the keys every result row carries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.procs import REPO_ROOT, child_env

RESULT_KEYS = {
    "contender", "size_gb", "layout", "status", "reason", "seconds", "median_s", "min_s",
    "max_s", "s_per_gb", "ratio_to_cp", "ratio_to_cp_direct", "call_seconds",
    "call_median_s", "call_max_s", "pack_s", "unpack_s", "producer_peak_private_mib",
    "consumer_peak_private_mib", "agent_peak_private_mib", "object_store_peak_mib", "verified",
}  # fmt: skip


def run_bench_cli(tmp: Path, *flags: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Run the bench as a subprocess (so its Ray never meets one this process has; its
    Train runs poll as fast as the tests' own, ``tests/conftest.py``)."""
    report = tmp / "bench.json"
    cmd = [
        sys.executable, "-m", "benchmarks", "bench", "--sizes", "0.004", "--repeats", "1",
        "--json", str(report), "--plot", str(tmp / "bench.png"),
        "--data-dir", str(tmp / "data"), "--num-cpus", "2", "--clean", "--no-prefault", *flags,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(report.read_text()), proc
