"""The Ray versions air-transfer supports: which minor versions are in, and the one
warning at import when the installed Ray is not (a fresh interpreter that reports
another Ray version; none in Ray's own worker processes)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from air_transfer.core.ray_range import NEWEST, OLDEST, requirement, unsupported
from tests.support.procs import REPO_ROOT, child_env


@pytest.mark.parametrize(
    ("version", "supported"),
    [
        ("2.58.0", True),
        ("2.59.0", True),
        ("2.60.3", True),
        ("2.57.1", False),
        ("2.61.0", False),
        ("3.0.0", False),
        ("2.60.0rc1", True),
        ("nightly", False),
    ],
)
def test_which_ray_versions_are_supported(version: str, supported: bool) -> None:
    assert (unsupported(version) is None) == supported
    assert OLDEST <= NEWEST and requirement() == ">=2.58,<2.61"


def test_the_message_names_the_range_the_version_and_the_remedy() -> None:
    why = unsupported("2.57.1")
    assert why is not None
    assert "supports Ray 2.58 to 2.60" in why and "this is Ray 2.57.1" in why
    assert "pip install 'ray[train]>=2.58,<2.61'" in why


#: Import the package in a fresh interpreter where Ray reports ``sys.argv[1]``.
IMPORT = """
import importlib.metadata as md, sys, warnings
real = md.version
md.version = lambda name: sys.argv[1] if name == "ray" else real(name)
warnings.simplefilter("default")
import air_transfer
import air_transfer.cli.main  # more of the package, imported after: nothing more said
"""


def imported_with(version: str, argv0: str = "-c") -> str:
    code = IMPORT if argv0 == "-c" else f"import sys; sys.argv[0] = {argv0!r}\n{IMPORT}"
    done = subprocess.run(
        [sys.executable, "-c", code, version],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


def test_an_unsupported_ray_is_said_once_at_import() -> None:
    """Defect: any Ray outside the pin imported silently (or pip refused it)."""
    err = imported_with("2.57.1")
    assert err.count("RayVersionWarning: air-transfer supports Ray 2.58 to 2.60") == 1, err
    assert imported_with("2.59.0") == ""


def test_rays_worker_processes_say_nothing() -> None:
    """Every agent and task imports the package: the driver's one warning is enough."""
    worker = "/x/ray/_private/workers/default_worker.py"
    assert imported_with("2.57.1", worker) == ""
