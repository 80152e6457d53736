"""Ray core's private API, in one of the two modules that touch Ray's private API (the
other, ``_ray``, holds Ray Train's).

Ray's public API has no per-node free object-store figure, no reference table of a
process, no key-value store that outlives every process, no worker table without
the dashboard, no backpressure option for streaming generators and no way to ask
which GCS ``auto`` means; these names are private or developer API and may move
between Ray releases. Keeping every such use here means an upgrade breaks one
module, and ``_ray_names`` lists them for a test that checks that each still exists
in the installed Ray. A failure of a query that only tunes behaviour (the free store) is
logged once and reported as unknown, never silently.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

logger = logging.getLogger(__name__)

#: Keyword of ``.options()`` that bounds how far a streaming generator runs ahead of
#: its consumer (Ray's own streaming ``DataIterator`` uses it); not in the public docs.
BACKPRESSURE_OPTION = "_generator_backpressure_num_objects"

_free_store_warned = False


def object_store_free_bytes(node_id: str) -> int | None:
    """Free object-store bytes on ``node_id``, as the GCS last heard from its raylet;
    None if Ray does not report it (logged once: size-based selection then never
    picks ``streamed``).

    Ray decrements the ``object_store_memory`` resource by what the store holds, and
    this per-node view is the only one that needs no grpc/dashboard extras.
    """
    global _free_store_warned
    try:
        per_node = ray._private.state.available_resources_per_node()
    except Exception as e:  # a DeveloperAPI: degrade to "unknown" rather than fail
        if not _free_store_warned:
            _free_store_warned = True
            logger.warning(
                "air-transfer: Ray did not report free object-store memory (%s: %s); "
                "strategy selection will not pick 'streamed' by size",
                type(e).__name__,
                e,
            )
        return None
    free = per_node.get(node_id, {}).get("object_store_memory")
    return None if free is None else int(free)


def referenced_ids() -> set[str] | None:
    """The hex ids of every object this process still references (its core worker's
    reference table: refs in scope, borrowed, in tasks it submitted or objects it
    put), or None if it is not connected to Ray. Ray has no public way to ask."""
    if not ray.is_initialized():
        return None
    worker: Any = ray._private.worker.global_worker  # private, untyped on purpose
    try:
        counts = worker.core_worker.get_all_reference_counts()
    except Exception:  # disconnected meanwhile
        return None
    return {key.decode() if isinstance(key, bytes) else str(key) for key in counts}


def kv_put(namespace: str, key: str, value: bytes) -> None:
    """Save ``value`` under ``key`` in the cluster's GCS key-value store (overwriting):
    it outlives every process but the GCS, so a record kept there survives the actor
    that wrote it. Ray's public API has no such store (Ray Serve's controller keeps
    its own checkpoint in it, through the same names)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True, namespace=namespace)


def kv_items(namespace: str, prefix: str) -> dict[str, bytes]:
    """Every ``key -> value`` saved by ``kv_put`` in ``namespace`` whose key starts
    with ``prefix``."""
    from ray.experimental import internal_kv

    out: dict[str, bytes] = {}
    for raw in internal_kv._internal_kv_list(prefix, namespace=namespace):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        value = internal_kv._internal_kv_get(key, namespace=namespace)
        if value is not None:
            out[key] = value
    return out


def kv_get(namespace: str, key: str) -> bytes | None:
    """The value saved by ``kv_put`` under ``key`` in ``namespace``, or None."""
    from ray.experimental import internal_kv

    value: bytes | None = internal_kv._internal_kv_get(key, namespace=namespace)
    return value


def kv_delete_prefix(namespace: str, prefix: str) -> None:
    """Remove every key saved by ``kv_put`` in ``namespace`` that starts with ``prefix``."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(prefix, del_by_prefix=True, namespace=namespace)


def kv_keys(namespace: str, prefix: str) -> list[str]:
    """The keys saved by ``kv_put`` in ``namespace`` that start with ``prefix``."""
    from ray.experimental import internal_kv

    raw = internal_kv._internal_kv_list(prefix, namespace=namespace)
    return [key.decode() if isinstance(key, bytes) else str(key) for key in raw]


def kv_delete(namespace: str, key: str) -> None:
    """Remove ``key`` saved by ``kv_put`` (nothing if it is not there)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=namespace)


_worker_alive_warned = False


def worker_alive(worker_id: str) -> bool | None:
    """Whether the Ray worker ``worker_id`` (hex: a driver, a task's or an actor's
    process) is alive, as the GCS's worker table says (its raylet reports a death
    at once, SIGKILL included); None if the GCS cannot be asked (logged once).
    Ray's public API has no such query without the dashboard (``ray.util.state``
    asks its HTTP server), which a cluster need not run."""
    global _worker_alive_warned
    try:
        from ray._private import state
        from ray.core.generated import gcs_pb2 as _gcs_pb2

        gcs_pb2: Any = _gcs_pb2  # generated, untyped
        accessor: Any = state.state._connect_and_get_accessor()  # private, untyped
        raw = accessor.get_worker_info(ray.WorkerID(bytes.fromhex(worker_id)))
    except Exception as e:
        if not _worker_alive_warned:
            _worker_alive_warned = True
            logger.warning(
                "air-transfer: cannot ask the GCS whether a worker lives (%s: %s); a "
                "replicated change whose caller died is resolved only after the busy "
                "timeout (or once its node is gone)",
                type(e).__name__,
                e,
            )
        return None
    if raw is None:  # never known, or dropped from the table long after it died
        return False
    return bool(gcs_pb2.WorkerTableData.FromString(raw).is_alive)


def bootstrap_address(address: str) -> str | None:
    """The GCS address ``ray.init(address=address)`` joins: ``auto`` resolved as Ray
    resolves it (``RAY_ADDRESS``, else the cluster ``ray start`` made on this machine,
    else any GCS running here), a local host name as the node's IP; None where Ray
    would start a cluster of its own (``local``). ConnectionError when ``auto`` finds
    none. Ray resolves it privately, and says which only in its log."""
    from ray._private import services

    found = services.canonicalize_bootstrap_address(address)
    return None if found is None else str(found)


def gcs_handshake(address: str, auto: bool, timeout_s: float) -> None:
    """Open a client of the GCS at ``address`` as ``ray.init`` first does, with this
    process's authentication token (turned on for ``auto`` where a token exists, as
    ``ray.init`` does from Ray 2.59 on; earlier ones have no such step), and close
    it. Ray's ``AuthenticationError`` when the GCS refuses the token, ``RpcError``
    when nothing there answers as a GCS in about ``timeout_s`` (plus Ray's fixed
    connect waits, ~10 s). ``ray.init`` reports both as "failed to connect" after
    retrying for a minute or more."""
    from ray import _raylet
    from ray._private.authentication import authentication_token_setup as auth

    enable = getattr(auth, "maybe_enable_token_auth_if_token_available", None)
    if auto and enable is not None:
        enable(warn_if_disabled=False)
    raylet: Any = _raylet  # compiled, untyped
    client = raylet.InnerGcsClient.standalone(address, None, int(timeout_s * 1000))
    del client


def streaming(method: Any, window: int) -> Any:
    """``method`` (an actor method) set up to return a streaming generator that runs
    at most ``window`` objects ahead of its consumer."""
    return method.options(num_returns="streaming", **{BACKPRESSURE_OPTION: window})


def draining_nodes() -> dict[str, int]:
    """The nodes Ray says will go (the autoscaler scales them down, the cloud preempts
    them): hex node id -> the deadline in ms since the epoch (0: none). Read from the
    GCS by Ray Train's own preemption watcher through the same private name."""
    found: dict[str, int] = ray._private.state.state.get_draining_nodes()  # private
    return {str(node): int(deadline) for node, deadline in found.items()}
