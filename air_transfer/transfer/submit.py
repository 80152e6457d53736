"""Start a transfer where its chunks will be owned: in this process, or (``owner="node"``)
in this node's agent, which submits the packing to itself.

``start_transfer`` (``to_object_ref_async``) submits the packing of a transfer this
process owns on a background thread, after scanning and checking the directory on
the caller's: the caller gets the checkpoint's ref at once as a relay
(``transfer.relay``) that the thread fills in when every packing task is submitted.

What goes into the object store is the transferred checkpoint itself, a
``ChunkedCheckpoint`` wrapping the handle, so that a task given the ref receives a
checkpoint. That class sits above this layer (and above the agent, which calls this):
the package root hands down how to make one (``CHECKPOINT_OF``, a ``core.provided``
slot), as it hands ``cluster.nodes`` the agent class.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import ray

from air_transfer.cluster import leases
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import running_in_agent, this_node_id
from air_transfer.config import TransferConfig
from air_transfer.core.provided import Provided
from air_transfer.core.scan import Source
from air_transfer.observe.telemetry import packing
from air_transfer.transfer.handle import RAY_ERRORS, TransferHandle, raise_transfer_error
from air_transfer.transfer.live_chunks import LiveChunks
from air_transfer.transfer.node_owned import NodeOwnedTransfers
from air_transfer.transfer.relay import Relays
from air_transfer.transfer.start import Prepared, prepare, start, submit
from air_transfer.transfer.strategies import Registrations, registrations

#: What a transferred checkpoint is stored as: the ``ChunkedCheckpoint`` of a handle,
#: made by what the package root provides (loaded on first use, see above).
CHECKPOINT_OF: Provided[Callable[[TransferHandle], object]] = Provided(
    "the checkpoint of a transfer handle"
)


#: What a transfer's completion is known as once its packing is submitted: the ref
#: that resolves when every chunk is packed, or None if packing is done.
Submitted = concurrent.futures.Future[ray.ObjectRef[Any] | None]


def start_transfer(
    source: Source, config: TransferConfig | None = None, *, background: bool = True
) -> tuple[ray.ObjectRef[Any], Submitted]:
    """Start transferring ``source``: the ref of the transferred checkpoint, usable at
    once, and the future of its completion. With ``background``, a transfer owned by
    this process is only scanned and checked here (bad input raises now) and its
    packing submitted by this process's submitting thread, whose errors the ref and
    the future raise; else (or ``owner="node"``) all of it happens on this thread."""
    config = config or TransferConfig()
    started = time.monotonic()
    submitted: Submitted = concurrent.futures.Future()
    if not background or config.owner == "node" or running_in_agent():
        ref, done, strategy = submit_transfer(source, config, blocking=not background)
        packing(strategy, done, started)
        submitted.set_result(done)
        return ref, submitted
    prepared = prepare(source, config)
    agent = AgentClient()
    key = uuid.uuid4().hex
    ref = agent.call(Relays.take, key, os.getpid())
    _in_background(lambda: _hand_over(agent, key, prepared, started), submitted)
    return ref, submitted


def _hand_over(
    agent: AgentClient, key: str, prepared: Prepared, started: float
) -> ray.ObjectRef[Any] | None:
    """Submit the packing of ``prepared`` and hand the checkpoint to the relay
    ``key`` (or what submitting raised, for its readers); the completion ref."""
    try:
        handle, done = start(prepared)
        checkpoint = CHECKPOINT_OF.get()(handle)
    except Exception as e:
        try:
            agent.call(Relays.give, key, e)
        except Exception:  # an error that does not pickle: its text, then
            agent.call(Relays.give, key, RuntimeError(f"submitting the packing failed: {e!r}"))
        raise
    agent.call(Relays.give, key, checkpoint)
    packing(handle.strategy.name, done, started)
    return done


_jobs: queue.SimpleQueue[tuple[Callable[[], Any], concurrent.futures.Future[Any]]] = (
    queue.SimpleQueue()
)
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def _in_background(job: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
    """Run ``job`` on this process's submitting thread (one daemon thread: jobs in
    call order), its outcome into ``future``."""
    global _thread
    _jobs.put((job, future))
    with _thread_lock:
        if _thread is None:
            _thread = threading.Thread(target=_run_jobs, name="air-transfer-submit", daemon=True)
            _thread.start()


def _forget_thread() -> None:
    """In a forked child: the thread did not come along; the next job starts one."""
    global _jobs, _thread, _thread_lock
    _jobs, _thread, _thread_lock = queue.SimpleQueue(), None, threading.Lock()


os.register_at_fork(after_in_child=_forget_thread)


def _run_jobs() -> None:
    while True:
        job, future = _jobs.get()
        try:
            future.set_result(job())
        except BaseException as e:
            # Without its traceback: its frames would hold the chunks submitted so far.
            future.set_exception(e.with_traceback(None))
        del job, future  # hold no transfer while waiting for the next


def submit_transfer(
    source: Source, config: TransferConfig | None = None, blocking: bool = False
) -> tuple[ray.ObjectRef[Any], ray.ObjectRef[Any] | None, str]:
    """Start transferring ``source``: the ref of the transferred checkpoint (put by
    this process or, for ``owner="node"``, by this node's agent, which packs with
    this process's strategy registrations and holds the transfer until this process
    lets go of it: ``cluster.leases``), the ref of its completion (None if packing is
    done) and the name of the strategy packing it. ``blocking``: the caller waits
    for packing to finish, which may then use this process too (``start.start``)."""
    config = config or TransferConfig()
    if config.owner == "node" and not running_in_agent():
        agent = AgentClient()
        call = agent.call(
            NodeOwnedTransfers.submit_transfer, source, config, registrations(config), requester()
        )
        try:
            ref, done, strategy, ids = ray.get(call)
        except RAY_ERRORS as e:  # FileNotFoundError, ManifestError... as themselves
            raise_transfer_error(None, f"the packing of {source.root!r} by the node agent", e)
        leases.hold(agent, ref.hex(), ids)
        return ref, done, strategy
    ref, done, handle = put_transfer(source, config, blocking=blocking)
    return ref, done, handle.strategy.name


def put_transfer(
    source: Source,
    config: TransferConfig,
    registered: Registrations | None = None,
    live: LiveChunks | None = None,
    blocking: bool = False,
) -> tuple[ray.ObjectRef[Any], ray.ObjectRef[Any] | None, TransferHandle]:
    """Start packing ``source`` here (``start.submit``, selecting among
    ``registered`` if given, reusing and recording ``live`` chunks if given) and put
    the transferred checkpoint: its ref, owned by this process, the ref of the
    completion (None if packed) and the handle. ``blocking``: as for ``start.start``."""
    handle, done = submit(source, config, registered, live, blocking)
    try:
        ref = ray.put(CHECKPOINT_OF.get()(handle))
    except BaseException:
        if live is not None:  # nobody can read it: offer none of its chunks again
            live.drop([handle.transfer_id])
        raise
    return ref, done, handle


def requester() -> tuple[int, str]:
    """This process as an agent's lease names it: pid and node id."""
    return os.getpid(), this_node_id()
