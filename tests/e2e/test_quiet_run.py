"""The quiet run the troubleshooting page promises: the README's first quick start
(TorchTrainer with torch DCP), run as a script with the page's settings in an
environment holding the ``default`` extra (the test extra has it), prints no warning
and no error, Ray's or air-transfer's. Without them it printed a dozen State API
warnings and a PreemptionWatcher error, which said nothing about the run."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import tomllib

from tests.support.procs import REPO_ROOT, child_env

# The script starts a Ray of its own: the shared one is stopped first.
pytestmark = pytest.mark.usefixtures("no_ray")

ROOT = Path(REPO_ROOT)
PAGE = (ROOT / "docs" / "operations" / "troubleshooting.md").read_text()
#: A warning or an error line: Python logging's, glog's (``[... E 123 456]``), a
#: traceback, Ray Train's State API complaint.
NOISE = re.compile(r"\bWARNING\b|\bERROR\b|\[[^\]]* [EW] \d+ \d+\]|Traceback|State API")
#: What Ray Train's placement-group cleaner prints (a traceback, then it stops
#: watching) where several Ray instances run on one machine: it looks for the State
#: API by ``address="auto"``. A user's run is alone; a test's may not be.
ANOTHER_RAY = "Found multiple active Ray instances"


def quiet_settings() -> dict[str, str]:
    """The ``export NAME=VALUE`` lines of the page's "A quiet run" block."""
    section = PAGE.split("## A quiet run", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^```bash\n(.*?)^```", section, re.M | re.S)
    assert "pip install '.[torch,default]'" in block
    return dict(re.findall(r"^export (\w+)=(\S+)", block, re.M))


def test_the_default_extra_is_in_the_test_environment() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    default = extras["optional-dependencies"]["default"]
    assert default and all(r in extras["optional-dependencies"]["test"] for r in default)


def test_the_quick_start_with_the_quiet_settings_prints_no_warning(tmp_path: Path) -> None:
    settings = quiet_settings()
    assert settings == {"RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0", "RAY_AUTH_MODE": "token"}
    readme = (ROOT / "README.md").read_text()
    block = re.findall(r"^```python\n(.*?)^```", readme, re.M | re.S)[0]
    assert "TorchTrainer" in block
    script = tmp_path / "quick_start.py"
    script.write_text(block)
    ray_tmp = tempfile.mkdtemp(prefix="quiet-ray-", dir="/tmp")  # short socket paths
    # As a user runs it: the State API where Ray puts it (the suite points it at nothing).
    env = child_env(RAY_TMPDIR=ray_tmp, **settings)
    env.pop("RAY_API_SERVER_ADDRESS", None)
    try:
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-5000:]
    assert "checkpoint_" in done.stdout  # the quick start printed its checkpoint
    printed = done.stdout + done.stderr
    noise = [line for line in printed.splitlines() if NOISE.search(line)]
    if ANOTHER_RAY in printed:  # another Ray on this machine (the page says so)
        noise = [n for n in noise if "(PlacementGroupCleaner" not in n or "State API" in n]
    assert noise == [], "\n".join(noise)
