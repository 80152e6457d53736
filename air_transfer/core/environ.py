"""What a process runs with: the ``AIR_TRANSFER_*`` settings from its environment,
and the air-transfer version.

The settings are read where they are used, in whichever process that is: the
driver, Ray Train's controller and workers, each node's agent, the replica
registry. A user sets them once, on the driver, so they travel: into Ray Train's
list of variables it copies to its controller and workers (``train``), and into
the runtime environment of the library's own long-lived actors when they are
started (``cluster.nodes``). An actor started earlier keeps the settings it was
started with; a caller that sets one differently is warned.
"""

from __future__ import annotations

import os
from importlib.metadata import PackageNotFoundError, version

PROGRESS = "AIR_TRANSFER_PROGRESS"
METRICS = "AIR_TRANSFER_METRICS"
TRAIN_HOOKS = "AIR_TRANSFER_TRAIN_HOOKS"
REPAIR_MIB_S = "AIR_TRANSFER_REPAIR_MIB_S"
PLACED_SWEEP_S = "AIR_TRANSFER_PLACED_SWEEP_S"

#: Every setting, and what it does (the one list: a test checks that the package
#: reads no other ``AIR_TRANSFER_*`` variable).
SETTINGS: dict[str, str] = {
    PROGRESS: "progress bars on (1) or off (0) where TransferConfig.progress is None; "
    "default: on when stderr is a terminal",
    METRICS: "0 turns the Prometheus metrics off; default on",
    TRAIN_HOOKS: "0 leaves Ray Train's own checkpoint copies for node storage; default 1",
    REPAIR_MIB_S: "bandwidth bound of replica repair, MiB/s; default 256",
    PLACED_SWEEP_S: "seconds between the replica registry's looks for orphan placed "
    "blobs of writers that died (placement='writer'); 0 turns them off; default 60",
}


def captured() -> dict[str, str]:
    """The settings set in this process's environment, to carry to another process."""
    return {name: os.environ[name] for name in SETTINGS if name in os.environ}


def differences(mine: dict[str, str], theirs: dict[str, str]) -> dict[str, tuple[str, str]]:
    """``name -> (mine, theirs)`` for each setting set in ``mine`` that ``theirs``
    sets otherwise or not at all ("" for not set)."""
    return {
        name: (value, theirs.get(name, ""))
        for name, value in mine.items()
        if theirs.get(name) != value
    }


def package_version() -> str:
    """The installed air-transfer's version ("0+unknown" for a source tree that was
    never installed)."""
    try:
        return version("air-transfer")
    except PackageNotFoundError:
        return "0+unknown"
