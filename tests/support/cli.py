"""The ``air-transfer`` command run as a user runs it: ``python -m air_transfer.cli``
in a process of its own, joining the test's cluster by its address."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.procs import REPO_ROOT, child_env

#: A command joins the cluster and imports Ray Train: seconds, more on busy cores.
TIMEOUT_S = 300


def air_transfer(address: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``air-transfer ARGS --address ADDRESS``, its exit status, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "air_transfer.cli", *args, "--address", address],
        cwd=REPO_ROOT,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


def air_transfer_json(address: str, *args: str) -> Any:
    """``air-transfer ARGS --json``'s document; the command must succeed."""
    done = air_transfer(address, *args, "--json")
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stderr}"
    return json.loads(done.stdout)


def files_under(top: Path) -> dict[str, bytes]:
    """The user's files under ``top`` (not the library's hidden ones) and their bytes."""
    return {
        str(p.relative_to(top)): p.read_bytes()
        for p in sorted(top.rglob("*"))
        if p.is_file() and ".air-" not in str(p.relative_to(top))
    }
