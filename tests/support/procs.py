"""Child processes of the tests (the bench, the demo, a writer to kill, a fresh
interpreter): they run from the repository root with it on their PYTHONPATH, so that
``python -m benchmarks`` and ``tests.support`` import, and never join a Ray cluster
that happens to be running."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root: ``tests``, ``benchmarks`` and (in a checkout) ``air_transfer``.
REPO_ROOT = str(Path(__file__).resolve().parents[2])


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child: the repository root first on its
    PYTHONPATH, no ``RAY_ADDRESS``, no usage stats; then ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    paths = [REPO_ROOT, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    return {**env, **extra}
