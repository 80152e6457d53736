"""The one entry to start a transfer, ``start_transfer``, and where it starts: where
its chunks will be owned, and on which thread.

- ``owner="node"``: in this node's agent, which packs it (``start.start``) and holds
  it for this process (a lease, ``cluster.transfer_leases``);
- in the background (``to_object_ref_async``): the directory is scanned and checked
  on the caller's thread (``start.prepare``), the packing started on this process's
  submitting thread; the caller gets the checkpoint's ref at once as a relay
  (``transfer.relay``) that the thread fills in;
- else on this thread: ``prepare`` then ``start``, and the checkpoint put.
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
import time
import uuid
from collections.abc import Callable

import ray

from air_transfer.cluster import transfer_leases
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import running_in_agent, this_node_id
from air_transfer.cluster.refs import CheckpointRef, DoneRef
from air_transfer.config import TransferConfig
from air_transfer.core.scan import Source
from air_transfer.core.threads import start_daemon
from air_transfer.observe.telemetry import packing
from air_transfer.transfer.handle import RAY_ERRORS, raise_transfer_error
from air_transfer.transfer.node_owned import NodeOwnedTransfers
from air_transfer.transfer.relay import Relays
from air_transfer.transfer.start import Prepared, prepare, start
from air_transfer.transfer.strategies import registrations

#: What a transfer's completion is known as once its packing is submitted: the ref
#: that resolves when every chunk is packed, or None if packing is done.
Submitted = concurrent.futures.Future[DoneRef | None]


def start_transfer(
    source: Source,
    config: TransferConfig | None = None,
    *,
    background: bool = True,
    blocking: bool = False,
) -> tuple[CheckpointRef, Submitted]:
    """Start transferring ``source``: the ref of the transferred checkpoint, usable at
    once, and the future of its completion (the ref that resolves when every chunk
    is packed, or None if packing is done). With ``background``, a transfer owned by
    this process is only scanned and checked here (bad input raises now) and its
    packing started by this process's submitting thread, whose errors the ref and
    the future raise; else (or ``owner="node"``) all of it happens on this thread.
    ``blocking`` (without ``background``): the caller waits for packing to finish,
    which may then use this process too."""
    config = config or TransferConfig()
    started = time.monotonic()
    submitted: Submitted = concurrent.futures.Future()
    if background and config.owner != "node" and not running_in_agent():
        prepared = prepare(source, config)
        agent = AgentClient()
        key = uuid.uuid4().hex
        ref = agent.call(Relays.take, key, os.getpid())
        _in_background(lambda: _hand_over(agent, key, prepared, started), submitted)
        return ref, submitted
    ref, done, strategy = start_on_this_thread(source, config, blocking and not background)
    packing(strategy, done, started)
    submitted.set_result(done)
    return ref, submitted


def start_on_this_thread(
    source: Source, config: TransferConfig, blocking: bool = False
) -> tuple[CheckpointRef, DoneRef | None, str]:
    """Start transferring ``source`` on this thread: the checkpoint's ref (put by this
    process or, for ``owner="node"``, by this node's agent), the ref of its
    completion (None if packing is done) and the strategy's name. ``blocking``: as
    for ``start_transfer``."""
    if config.owner != "node" or running_in_agent():
        here = start(prepare(source, config), blocking=blocking)
        return here.put(), here.done, here.handle.strategy.name
    return _in_agent(source, config)


def _hand_over(agent: AgentClient, key: str, prepared: Prepared, started: float) -> DoneRef | None:
    """Submit the packing of ``prepared`` and hand the checkpoint to the relay
    ``key`` (or what submitting raised, for its readers); the completion ref."""
    try:
        here = start(prepared)
        checkpoint = here.checkpoint()
    except Exception as e:
        try:
            agent.call(Relays.give, key, e)
        except Exception:  # an error that does not pickle: its text, then
            agent.call(Relays.give, key, RuntimeError(f"submitting the packing failed: {e!r}"))
        raise
    agent.call(Relays.give, key, checkpoint)
    packing(here.handle.strategy.name, here.done, started)
    return here.done


_jobs: queue.SimpleQueue[tuple[Callable[[], DoneRef | None], Submitted]] = queue.SimpleQueue()
_thread: threading.Thread | None = None
_thread_lock = threading.Lock()


def _in_background(job: Callable[[], DoneRef | None], future: Submitted) -> None:
    """Run ``job`` on this process's submitting thread (one daemon thread: jobs in
    call order), its outcome into ``future``."""
    global _thread
    _jobs.put((job, future))
    with _thread_lock:
        if _thread is None:
            _thread = start_daemon("air-transfer-submit", _run_jobs)


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


def _in_agent(source: Source, config: TransferConfig) -> tuple[CheckpointRef, DoneRef | None, str]:
    """Have this node's agent transfer ``source`` (``owner="node"``): the checkpoint's
    ref, put by the agent, which packs with this process's strategy registrations
    and holds the transfer until this process lets go of it (``cluster.transfer_leases``);
    the ref of its completion (None if packing is done); the strategy's name."""
    agent = AgentClient()
    call = agent.call(
        NodeOwnedTransfers.submit_transfer, source, config, registrations(config), requester()
    )
    try:
        ref, done, strategy, ids = ray.get(call)
    except RAY_ERRORS as e:  # FileNotFoundError, ManifestError... as themselves
        raise_transfer_error(None, f"the packing of {source.root!r} by the node agent", e)
    transfer_leases.hold(agent, ref.hex(), ids)
    return ref, done, strategy


def requester() -> tuple[int, str]:
    """This process as an agent's lease names it: pid and node id."""
    return os.getpid(), this_node_id()
