"""Node storage replicas, the caller's view: the cluster's replica registry (one
actor on the head node, started by the first user) and which copy to use.

The registry's class sits in ``storage.server`` (the other room), so the package
root hands it down (``REGISTRY_CLASS``, a ``core.provided`` slot), as it hands
``cluster.nodes`` the agent class. Every call goes through ``call``, naming the
method of ``RegistryCalls`` (``storage.replica_wire``) that answers it, so mypy
checks its arguments: when the registry's actor dies under it, the next caller
starts another from the record it saved, and the call is made again there (each is
idempotent).

``begin`` starts a change: the registry answers at once, "busy" while another
change holds one of its paths, and the caller waits here, asking again, so that no
thread of the registry ever waits (its ``end`` would queue behind them).

``place`` picks the copies of a new storage, after ``check_roots`` refused roots that
cannot keep copies. ``read_order`` is how a reader picks among the fresh copies: its own node's copy
first (a local read), else the copies in an order rotated by a hash of the
reader's node, so the readers of N nodes spread over the K copies, and each reader
keeps to one (the copy's chunk cache serves its later reads); the others follow,
for failover.
"""

from __future__ import annotations

import errno
import functools
import logging
import posixpath
import random
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any, Concatenate, TypeVar

import ray
from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from air_transfer.cluster import identity
from air_transfer.cluster.fetch import get
from air_transfer.cluster.nodes import (
    NAMESPACE,
    REGISTRY_NAME,
    head_node_id,
    live_node_ids,
    this_node_id,
)
from air_transfer.cluster.rpc import P, R
from air_transfer.core.provided import Provided
from air_transfer.errors import CheckpointLostError
from air_transfer.storage.replica_wire import Copy, Owner, RegistryCalls

#: The registry's class (``storage.server.replica_host.ReplicaHost``), provided by
#: the package root and loaded on first start (see above).
REGISTRY_CLASS: Provided[type] = Provided("the replica registry's class")
#: How long a call keeps trying registries started again before it gives up.
RETRY_S = 60.0
#: The longest pause between two asks of a change waiting for its paths (seconds).
MAX_PAUSE_S = 0.1
#: How often a change still waiting for its paths says so (seconds).
WAIT_LOG_S = 60.0

logger = logging.getLogger(__name__)
T = TypeVar("T")


@functools.cache
def _remote_class() -> Any:
    remote: Any = ray.remote
    return remote(REGISTRY_CLASS.get())


def registry() -> Any:
    """The registry actor, started on the head node (with this process's settings)
    if none runs; RuntimeError if one of another air-transfer version runs."""
    return _start()


#: The registry's handle for ``call``, with the Ray session it belongs to: looked
#: up by name once, not at each of the many asks of a change waiting for a path.
_cached: tuple[str, Any] | None = None
_cached_lock = threading.Lock()


def _registry_here() -> Any:
    global _cached
    ctx = ray.get_runtime_context()
    session = f"{ctx.gcs_address}/{ctx.get_job_id()}"
    with _cached_lock:
        if _cached is None or _cached[0] != session:
            _cached = (session, _start())
        return _cached[1]


def _start() -> Any:
    handle = (
        _remote_class()
        .options(
            name=REGISTRY_NAME,
            namespace=NAMESPACE,
            get_if_exists=True,
            lifetime="detached",
            num_cpus=0,
            max_concurrency=32,
            max_restarts=0,  # a dead one is started again by the next caller
            scheduling_strategy=NodeAffinitySchedulingStrategy(head_node_id(), soft=False),
            **identity.runtime_env(),
        )
        .remote()
    )
    return identity.checked(handle, REGISTRY_NAME)


def call(
    method: Callable[Concatenate[RegistryCalls, P], R], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """``method(*args, **kwargs)`` on the registry, made again on a registry started
    afresh (from the saved record) when the actor died under it; ConnectionError if
    none answers within ``RETRY_S``."""
    global _cached
    deadline = time.monotonic() + RETRY_S
    name = method.__name__
    while True:
        actor = _registry_here()
        try:
            result: R = get(
                actor.call.options(name=f"ReplicaRegistry:{name}").remote(method, *args, **kwargs)
            )
            return result
        except RayActorError as e:
            with _cached_lock:
                if _cached is not None and _cached[1] is actor:
                    _cached = None
            if time.monotonic() > deadline:
                raise ConnectionError(
                    f"the replica registry did not answer {name} for {RETRY_S:.0f} s: {e}"
                ) from e
            logger.warning(
                "air-transfer: the replica registry died during %s (%s); asking the "
                "one started in its place",
                name,
                type(e).__name__,
            )
            time.sleep(0.2)  # the dead actor's name is freed once Ray knows


def begin(
    key: str, paths: list[str], op: str, staging: dict[str, str] | None = None
) -> tuple[list[Copy], list[str]]:
    """Start change ``op`` of ``paths`` (relative) in storage ``key``, made by this
    process (Ray resolves it if this process dies: ``dead_ops``), its staging file
    on each copy if it is a commit: the copies to apply it to, and the fresh ones.
    Waits, asking again, while another change holds one of its paths."""
    owner = Owner(ray.get_runtime_context().get_worker_id(), this_node_id())
    _, copies, fresh = until_granted(
        lambda: call(RegistryCalls.begin, key, paths, op, owner, staging),
        (0.002, MAX_PAUSE_S),
        f"a change of {', '.join(paths) or 'the root'} in node storage {key}",
        "another change of the same paths",
    )
    return copies, fresh


def until_granted(
    ask: Callable[[], T | None], pauses: tuple[float, float], who: str, whom: str
) -> T:
    """``ask()`` again until it grants (answers anything but None), pausing from
    ``pauses[0]`` seconds up to ``pauses[1]``, jittered (racing askers spread out); a
    warning every ``WAIT_LOG_S`` that ``who`` waits for ``whom``."""
    pause, started = pauses[0], time.monotonic()
    said = started
    while (got := ask()) is None:
        time.sleep(pause * (0.5 + random.random()))
        pause = min(pause * 1.5, pauses[1])
        if time.monotonic() - said > WAIT_LOG_S:
            said = time.monotonic()
            logger.warning(
                "air-transfer: %s has waited %.0f s for %s to end", who, said - started, whom
            )
    return got


def place(
    primary: str, root: str, wanted: int, named: tuple[str, ...], template: str
) -> list[Copy]:
    """The K copies of a new storage: ``primary`` (its root ``root``), the nodes the
    user ``named``, then other live nodes in id order (each root ``template``)."""
    live = live_node_ids()
    for node in (primary, *named):
        if node not in live:
            raise ValueError(f"node {node!r} is not a live node of this Ray cluster")
    if len({primary, *named}) != 1 + len(named):
        raise ValueError(f"replica nodes must be distinct, got {[primary, *named]}")
    chosen = [primary, *named, *sorted(live - {primary, *named})]
    if len(chosen) < wanted or len(named) >= wanted:
        raise ValueError(
            f"replicas={wanted} needs {wanted} distinct live nodes; this cluster has "
            f"{len(live)}, and {1 + len(named)} were named (the storage node included)"
        )
    return [(primary, root)] + [(n, template.format(node_id=n)) for n in chosen[1:wanted]]


def check_roots(root: str, replica_root: str, replicas: int) -> None:
    """Refuse roots that cannot hold K copies: '/' (a node's whole disk, never
    empty, which repair would have to empty), and copies nested inside the storage
    node's root (its listings would show them as the user's files)."""
    if replicas < 2:
        return
    if root == "/":
        raise ValueError(
            f"replicas={replicas} needs a dedicated root: root='/' (the default) is a "
            "node's whole disk, and each other copy's root is emptied whenever repair "
            "makes it again; pass storage_filesystem(..., root='/path/to/storage')"
        )
    if posixpath.normpath(replica_root) == "/":
        raise ValueError(
            "replica_root='/' is a node's whole disk, which repair would have to empty; "
            "pass a directory of its own (replica_root='/path/{node_id}')"
        )
    sample = posixpath.normpath(replica_root.format(node_id="0" * 56))
    if sample != root and posixpath.commonpath([root, sample]) == root:
        raise ValueError(
            f"replica_root={replica_root!r} lies inside root={root!r}: the storage node's "
            "listings would show the other copies as files of the storage; put the copies "
            "beside it (e.g. replica_root='/path/copies/{node_id}')"
        )


def fresh_at_start(copies: list[Copy], empty: dict[str, bool]) -> list[str]:
    """The copies of a storage registered now that are complete: the storage node's
    (the first), and the others only if they hold what it holds, which is known
    only when all are empty (a root used before, by an earlier cluster or with one
    copy, holds what nothing vouches for: repair makes those copies again)."""
    primary = copies[0][0]
    if not empty[primary]:
        return [primary]
    return [node for node, _ in copies if empty[node]]


def view(key: str) -> tuple[list[Copy], list[str], list[str], int] | None:
    """``(member copies, fresh nodes, syncing nodes, K)`` of storage ``key``."""
    return call(RegistryCalls.view, key)


def read_order(key: str, copies: list[Copy], fresh: list[str], here: str) -> list[Copy]:
    """The fresh copies in the order a reader on node ``here`` tries them."""
    roots = dict(copies)
    nodes = sorted(n for n in fresh if n in roots)
    if not nodes:
        return []
    turn = zlib.crc32(f"{here}:{key}".encode()) % len(nodes)
    ordered = nodes[turn:] + nodes[:turn]
    if here in ordered:
        ordered.remove(here)
        ordered.insert(0, here)
    return [(n, roots[n]) for n in ordered]


def full(error: BaseException | None) -> bool:
    """Whether ``error`` says a copy's disk is full (or over its quota): that copy
    could not take a change the others can, as if it were lost."""
    return isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT)


def is_lost(error: BaseException, reading: bool = True) -> bool:
    """Whether ``error`` says a copy is unreachable (its node or agent is gone, or,
    ``reading``, the objects it owned), rather than what the copy answered. In a
    write, CheckpointLostError is an answer: the source's chunks are gone, for every
    copy alike."""
    if isinstance(error, RayTaskError):
        return False
    if isinstance(error, CheckpointLostError):
        return reading
    return isinstance(error, ConnectionError | RayError)
