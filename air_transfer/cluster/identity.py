"""Which air-transfer a long-lived actor of the library runs, checked before it serves.

Each node's agent and the replica registry are detached: they outlive the job that
started them and serve every later job of the cluster. One started by another
air-transfer version would run its own code for this caller (other wire formats,
other checks), so a caller asks each such actor once what it runs and refuses one
of another version, saying how to replace it (``shutdown_agents()``). The settings
it was started with (``core.environ``) stay its own; a caller that sets one
otherwise is warned once, as the actor keeps using its own.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Any

import ray

from air_transfer.core import environ

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Identity:
    """What a process runs: its air-transfer version, and the ``AIR_TRANSFER_*``
    settings set in its environment."""

    version: str
    settings: dict[str, str] = field(default_factory=dict)


def this_process() -> Identity:
    """This process's identity (what an actor's ``identity()`` method returns)."""
    return Identity(environ.package_version(), environ.captured())


def runtime_env() -> dict[str, dict[str, dict[str, str]]]:
    """The ``.options()`` that start an actor with this process's settings."""
    settings = environ.captured()
    return {"runtime_env": {"env_vars": settings}} if settings else {}


_checked: dict[str, Any] = {}  # actor name -> the handle checked in this process
_lock = threading.Lock()


def checked(handle: Any, name: str) -> Any:
    """``handle`` (of the actor named ``name``) once it is known to run this
    process's air-transfer version: RuntimeError naming both versions otherwise;
    asked once per actor and process."""
    with _lock:
        if _checked.get(name) == handle:  # handles compare by actor id
            return handle
    try:
        method = handle.identity
    except AttributeError:  # started by a version from before this check
        theirs = Identity("older than the identity check")
    else:
        try:
            theirs = ray.get(method.remote())
        except ray.exceptions.RayActorError:
            return handle  # dead: it serves nothing, and the caller's call says so
    mine = this_process()
    if theirs.version != mine.version:
        raise RuntimeError(
            f"the air-transfer actor {name!r} runs air-transfer {theirs.version}, this "
            f"process {mine.version}: it outlives the jobs that use it and would serve "
            "this one with its own code. Once no job of the other version runs, call "
            "air_transfer.shutdown_agents() (checkpoints that agents own are lost); the "
            "next call starts agents of this version"
        )
    differing = environ.differences(mine.settings, theirs.settings)
    if differing:
        logger.warning(
            "air-transfer: the actor %r was started with other settings and keeps "
            "them: %s; call air_transfer.shutdown_agents() to start agents with this "
            "process's",
            name,
            ", ".join(f"{k}={v!r} here, {t!r} there" for k, (v, t) in differing.items()),
        )
    with _lock:
        _checked[name] = handle
    return handle


def forget() -> None:
    """Ask every actor again (``shutdown_agents`` ended them)."""
    with _lock:
        _checked.clear()
