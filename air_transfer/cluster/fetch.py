"""Fetch object-store chunks in order with a bounded window in flight, and what a
failed fetch or remote call raised, out of Ray's wrappers.

Shared by every strategy, node-storage reads and every call to an agent; Ray's
public API only.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar, overload

import ray
from ray.exceptions import RayTaskError

from air_transfer.core.knobs import KNOBS
from air_transfer.core.threads import pool
from air_transfer.errors import CheckpointLostError

T = TypeVar("T")
#: What ``fetch_in_order`` gets: a ref, a list of refs, or a str (yielded as it is).
Fetched = ray.ObjectRef[T] | list[ray.ObjectRef[T]] | str

#: What air-transfer raises as itself, whichever process raised it (README, Errors:
#: ManifestError is a ValueError; ChecksumError, SourceChangedError, ConnectionError,
#: FileNotFoundError, PermissionError... are OSErrors).
OWN_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, TypeError, CheckpointLostError)


def fresh(error: BaseException) -> BaseException:
    """A copy of ``error`` to raise in its place. Raising an exception that a frame of
    its own traceback still references (a loop variable, Ray's wrapper whose
    ``cause`` it is) makes a reference cycle: the frames, and the handle with every
    chunk ref they hold, would then stay alive until the garbage collector runs,
    keeping the chunks pinned in the object store."""
    return copy.copy(error)


def innermost(error: BaseException) -> BaseException:
    """What the task or actor at the end of a chain of calls raised: ``error`` with
    every ``RayTaskError`` wrapper taken off (one per hop: an agent that called
    another agent wraps twice)."""
    while isinstance(error, RayTaskError) and isinstance(error.cause, BaseException):
        error = error.cause
    return error


def raise_own(error: BaseException) -> None:
    """Raise a copy of the error of ``OWN_ERRORS`` that a remote task or actor raised
    and ``error`` (what a ``ray.get`` raised) wraps; return if it wraps something
    else (a bug: Ray's wrapper, which keeps its remote traceback, is the caller's to
    raise).

    A copy, raised here and bound to no variable: raised as it is, the cause would
    get the wrapper as its ``__context__`` while the wrapper holds it as ``.cause``;
    bound to a variable of the frame that raises it, its traceback would hold that
    frame, which holds it. Either is a reference cycle that keeps the traceback, and every frame
    and chunk ref in it, alive until the cyclic garbage collector happens to run."""
    cause = innermost(error)
    if cause is not error and isinstance(cause, OWN_ERRORS):
        raise fresh(cause) from None


@overload
def get(ref: ray.ObjectRef[T], timeout: float | None = None) -> T: ...


@overload
def get(ref: list[ray.ObjectRef[T]], timeout: float | None = None) -> list[T]: ...


def get(
    ref: ray.ObjectRef[T] | list[ray.ObjectRef[T]], timeout: float | None = None
) -> T | list[T]:
    """``ray.get(ref)``, raising what it raises without the traceback it has there:
    Ray raises a lost object's or dead actor's error from a frame that holds it in
    a local variable, and holds ``ref`` too, so the error, its traceback and every
    frame it passed through (a reader's, with each chunk ref and chunk it holds) form
    a reference cycle, kept alive, chunks pinned in the store, until the cyclic
    garbage collector happens to run."""
    try:
        return ray.get(ref, timeout=timeout)
    except BaseException as e:
        raise e.with_traceback(None)  # noqa: B904 (the same error, without the cycle)


@overload
def fetch_in_order(refs: Iterable[ray.ObjectRef[T]], window: int) -> Iterator[T]: ...


@overload
def fetch_in_order(refs: Iterable[ray.ObjectRef[T] | str], window: int) -> Iterator[T | str]: ...


@overload
def fetch_in_order(refs: Iterable[list[ray.ObjectRef[T]]], window: int) -> Iterator[list[T]]: ...


def fetch_in_order(refs: Iterable[Fetched[T]], window: int) -> Iterator[T | list[T] | str]:
    """Yield ``get(ref)`` for each ref in order (a list, or a streaming
    generator's refs as they come), keeping up to ``window`` gets in flight ahead so
    cross-node pulls overlap with the consumer's work. A str among them (a checksum
    already known among ones still being packed) is yielded as it is.

    Threads, not ``ray.wait(fetch_local=True)``: a get in flight is a pull that Ray
    keeps going, and its result is dropped as soon as the consumer moves on.
    """
    pending: deque[Future[T | list[T] | str]] = deque()
    threads = min(window, KNOBS.max_fetch_threads)
    fetches = pool("air-transfer-fetch", threads)
    try:
        upcoming = iter(refs)
        for ref in upcoming:
            pending.append(_start(fetches, ref))
            if len(pending) >= window:
                break
        while pending:
            result = pending.popleft().result()
            nxt = next(upcoming, None)
            if nxt is not None:
                pending.append(_start(fetches, nxt))
            yield result
            del result
    finally:
        for f in pending:
            f.cancel()
        fetches.shutdown(wait=False, cancel_futures=True)


def _start(pool: ThreadPoolExecutor, ref: Fetched[T]) -> Future[T | list[T] | str]:
    """The get of ``ref`` (a ref, or a list of refs) in ``pool``, or, for a str (a
    checksum already known), a done future of it."""
    if not isinstance(ref, str):
        return pool.submit(get, ref)
    done: Future[T | list[T] | str] = Future()
    done.set_result(ref)
    return done
