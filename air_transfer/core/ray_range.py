"""The Ray versions air-transfer supports, and the warning when another one runs.

The library reaches into Ray Train's private names (``cluster._ray``), so each
supported Ray minor version is checked: its private-API gate
(``tests/unit/test_ray_internals.py``) and a Ray Train round
(``.ci/train_round.py``), each in a fresh environment (``.ci/ray_versions.py``; the
whole suite runs on the newest). ``pyproject.toml`` pins the same range (a test
compares them). Another Ray imports, with one warning saying so: what breaks then
is a private name that moved, failing where it is used. Plain Python (the version
is read from the installed package's metadata, without importing Ray).
"""

from __future__ import annotations

import sys
import warnings
from importlib.metadata import PackageNotFoundError, version

#: The oldest and the newest Ray minor version supported, each checked in CI.
OLDEST = (2, 58)
NEWEST = (2, 60)


class RayVersionWarning(UserWarning):
    """The installed Ray is outside the versions air-transfer supports."""


def requirement() -> str:
    """The supported range as a requirement specifier: ``>=2.58,<2.61``."""
    return f">={OLDEST[0]}.{OLDEST[1]},<{NEWEST[0]}.{NEWEST[1] + 1}"


def unsupported(ray_version: str) -> str | None:
    """Why ``ray_version`` is not supported (what to do about it), or None if it is."""
    try:
        minor = tuple(int(part) for part in ray_version.split(".")[:2])
    except ValueError:
        minor = ()
    if len(minor) == 2 and OLDEST <= minor <= NEWEST:
        return None
    return (
        f"air-transfer supports Ray {OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]} "
        f"(each checked: its private-API gate and a Ray Train round); this is Ray "
        f"{ray_version}, where a private Ray Train name it uses may have moved. Install "
        f"a supported Ray (pip install 'ray[train]{requirement()}'), or check this one "
        "in a clone: python -m pytest tests/unit/test_ray_internals.py"
    )


def warn_if_unsupported() -> None:
    """One ``RayVersionWarning`` if the installed Ray is not supported; none in Ray's
    worker processes (every agent and task imports the library: the driver's one
    warning says it for all)."""
    if sys.argv and sys.argv[0].endswith("default_worker.py"):
        return
    try:
        installed = version("ray")
    except PackageNotFoundError:  # imported without Ray: what needs it says so
        return
    why = unsupported(installed)
    if why is not None:
        warnings.warn(why, RayVersionWarning, stacklevel=2)
