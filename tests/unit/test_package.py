"""The package itself: its public names, its version, and what importing it costs the
processes that run its code without using Ray Train (each node's agent, the workers
of its packing tasks), which import ``air_transfer`` and with it whatever
``__init__`` imports."""

from __future__ import annotations

import subprocess
import sys
from importlib.metadata import version

import pytest

import air_transfer
from tests.support.procs import REPO_ROOT, child_env


def test_every_public_name_is_importable() -> None:
    for name in air_transfer.__all__:
        assert getattr(air_transfer, name) is not None, name
    assert set(air_transfer.__all__) <= set(dir(air_transfer))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = air_transfer.nope  # type: ignore[attr-defined]


def test_the_version_is_the_installed_packages() -> None:
    assert air_transfer.__version__ == version("air-transfer")


def test_the_agents_code_imports_no_ray_train() -> None:
    """Ray Train (and with it pandas and Ray Data, ~1 s of CPU and ~60 MiB per
    process) is imported only by code that needs it: a fresh interpreter that imports
    the package, then the agent, has not imported it after either (one interpreter
    for both: each start imports Ray)."""
    heavy = "sorted(m for m in ('ray.train', 'pandas', 'ray.data', 'torch') if m in sys.modules)"
    code = f"import sys, air_transfer; print({heavy}); import air_transfer.agent; print({heavy})"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True, text=True, check=True, env=child_env(), cwd=REPO_ROOT,
    )  # fmt: skip
    assert out.stdout.splitlines() == ["[]", "[]"], out.stdout
