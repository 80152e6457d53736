"""One Ray kept across test modules: the local instance (``local()``) or the two-node
mock cluster (``tests.support.cluster.shared_cluster``), started the first time a
module asks and kept for the next module that asks for the same one. Starting Ray
costs seconds of CPU (a GCS, raylets, agents, idle workers); the suite would otherwise
pay it once per module.

Asking for the other one, or starting a cluster of one's own
(``tests.support.cluster.start_cluster``), stops the shared one first (``release()``),
so that two instances never run at once. One that a test shut down or that lost a
node is started afresh at the next ask. The session's end releases what is left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import ray

from tests.support.procs import REPO_ROOT

if TYPE_CHECKING:
    from ray.cluster_utils import Cluster

MiB = 1024 * 1024
T = TypeVar("T")
#: What Ray raises when a new node's raylet has not registered with the GCS within a
#: fixed 30 s (``ray/_private/node.py``, not configurable): seen on CI's two busy
#: cores when a metrics agent starts with the node.
STARTUP_TIMEOUT = "timed out during startup"
#: Starts of one Ray tried before a test fails on it.
START_ATTEMPTS = 3


def start_with_retries(start: Callable[[], T], stop: Callable[[], None]) -> T:
    """``start()``, made again (after ``stop()`` cleans up what it left) while Ray
    says a node timed out during startup: a slow start on a loaded machine is not
    the defect a test is after. Any other error is raised at once."""
    for attempt in range(1, START_ATTEMPTS + 1):
        try:
            return start()
        except Exception as e:
            if STARTUP_TIMEOUT not in str(e) or attempt == START_ATTEMPTS:
                raise
            logging.getLogger(__name__).warning(
                "Ray did not start (attempt %d of %d): %s; starting it again",
                attempt, START_ATTEMPTS, e,
            )  # fmt: skip
            stop()
    raise AssertionError("unreachable")


#: ("local", GCS address) or ("cluster", the Cluster); None when nothing is shared.
_held: tuple[str, object] | None = None


def _address() -> str | None:
    return ray.get_runtime_context().gcs_address if ray.is_initialized() else None


def local() -> None:
    """This process connected to the shared local Ray (2 CPUs, a 512 MiB store, no
    dashboard), started if it is not running; its workers import ``tests.support``
    (and, in a checkout, ``air_transfer``) from the repository root."""
    global _held
    if _held is not None and _held[0] == "local" and _address() == _held[1]:
        return
    release()
    start_with_retries(
        lambda: ray.init(
            # "local": always a fresh instance, never a cluster that happens to be
            # running on this machine (ray.init() would attach to it).
            address="local",
            num_cpus=2,
            object_store_memory=512 * MiB,
            include_dashboard=False,
            logging_level="ERROR",
            runtime_env={"env_vars": {"PYTHONPATH": REPO_ROOT}},
        ),
        ray.shutdown,
    )
    _held = ("local", _address())


def held_cluster() -> Cluster | None:
    """The shared mock cluster, if one is held (intact or not)."""
    return _held[1] if _held is not None and _held[0] == "cluster" else None  # type: ignore[return-value]


def hold_cluster(cluster: Cluster) -> None:
    """Keep ``cluster`` (just started, this process connected) as the shared one."""
    global _held
    _held = ("cluster", cluster)


def release() -> None:
    """Stop whatever is shared, and disconnect this process from any Ray."""
    global _held
    held, _held = _held, None
    if ray.is_initialized():
        ray.shutdown()
    if held is not None and held[0] == "cluster":
        held[1].shutdown()  # type: ignore[attr-defined]
