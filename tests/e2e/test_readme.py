"""Every Python block of the README runs as a user runs it: each saved as a script and
run by a fresh interpreter in an empty directory, with a Ray of its own (its own temp
directory: it never meets the suite's), so that a README that no longer works fails
here, not in a newcomer's hands. The shell blocks are CI's (``.ci/readme_commands.py``:
each in a fresh virtual environment)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT, child_env

# Each block starts a Ray of its own: the shared one is stopped first.
pytestmark = pytest.mark.usefixtures("no_ray")

README = (Path(REPO_ROOT) / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


def test_the_readme_has_its_quick_starts() -> None:
    assert len(BLOCKS) >= 2 and any("TorchTrainer" in b for b in BLOCKS)


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}" for i in range(len(BLOCKS))])
def test_each_python_block_of_the_readme_runs(block: str, tmp_path: Path) -> None:
    script = tmp_path / "quick_start.py"
    script.write_text(block)
    # A short one: Ray's socket paths under it must fit a socket address (108 bytes).
    ray_tmp = tempfile.mkdtemp(prefix="readme-ray-", dir="/tmp")
    env = child_env(RAY_TMPDIR=ray_tmp)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
