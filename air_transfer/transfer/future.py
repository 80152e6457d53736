"""``TransferFuture``: a transferred checkpoint whose packing may still be running.

``ChunkedCheckpoint.to_object_ref_async`` returns one as soon as the directory is
scanned and checked (the packing tasks are submitted by a background thread:
``transfer.route``): ``ref`` is usable at once by any reader anywhere (a reader
waits for a chunk not yet packed), and the future itself says when the source
directory is no longer needed. It is a ``concurrent.futures.Future`` whose result is
``ref``, completed from Ray's own future of the transfer's completion object, so
``concurrent.futures.wait`` and ``as_completed`` take it with any other future.

Ray's future of an object whose session ended (``ray.shutdown()``) never completes,
and neither would a wait on it: while any such future is pending, one watcher thread
checks its session every ``KNOBS.session_poll_s`` and fails it with
CheckpointLostError once the session is over, for the chunks went with it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
import time
import weakref
from collections.abc import Callable
from typing import NoReturn, cast

import ray

from air_transfer.cluster.fetch import fresh
from air_transfer.cluster.refs import CheckpointRef, DoneRef, Status
from air_transfer.core.knobs import KNOBS
from air_transfer.core.threads import Periodic
from air_transfer.errors import CheckpointLostError
from air_transfer.transfer.handle import RAY_ERRORS, raise_transfer_error


class TransferFuture(concurrent.futures.Future[CheckpointRef]):
    """The packing of one checkpoint, as a ``concurrent.futures.Future``: ``ref``
    now, ``result()`` (``ref`` again) once the source is free (every chunk packed and
    checksummed), or the error packing raised.

    It is running from the start: the scan is done and readers of ``ref`` may
    already be waiting for its chunks, so it cannot be cancelled (``cancel()``
    returns False, ``cancelled()`` is False, as for a ``Future`` whose work has
    begun). Only the library completes it: do not call ``set_result`` and the like.
    """

    def __init__(
        self,
        ref: CheckpointRef,
        done: DoneRef | concurrent.futures.Future[DoneRef | None] | None,
    ) -> None:
        """``done``: the completion ref (None: packed), or the future of it while
        the packing tasks are being submitted (which fails if submitting does)."""
        super().__init__()
        self.set_running_or_notify_cancel()  # packing has started: no cancel()
        self._ref = ref
        self._session = session()
        if isinstance(done, concurrent.futures.Future):
            done.add_done_callback(self._submitted)
        else:
            self._follow(done)
        if not super().done():
            _watch(self, hold=False)

    def _follow(self, done: DoneRef | None) -> None:
        if done is None:  # packed already (or by a strategy that packs in the caller)
            self._complete(None)
        else:
            done.future().add_done_callback(self._settle)

    def _submitted(self, submitted: concurrent.futures.Future[DoneRef | None]) -> None:
        """The packing tasks are submitted, or submitting them failed: follow their
        completion, or fail with that error."""
        error = submitted.exception()
        if error is None:
            self._follow(submitted.result())
        else:
            self._complete(error)

    def _complete(self, error: BaseException | None) -> None:
        """Set the outcome (``ref``, or ``error`` as Ray or packing gave it: turned
        into ours when raised), unless the session's end set it first."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            if error is None:
                super().set_result(self._ref)
            else:
                super().set_exception(error)

    @property
    def ref(self) -> CheckpointRef:
        """The ObjectRef of the transferred checkpoint (a ``ChunkedCheckpoint``):
        pass it to tasks, actors, ``from_object_ref``, before packing is done."""
        return self._ref

    def done(self) -> bool:
        """Whether packing has finished, successfully or not (a session that ended
        first finishes it, with CheckpointLostError).

        Returns:
            True once ``result()`` returns or raises without waiting.
        """
        self._check_session()
        return super().done()

    def cancel(self) -> bool:
        """Refuse to cancel: packing has started when the future exists (see the
        class).

        Returns:
            False, always.
        """
        return super().cancel()

    def result(self, timeout: float | None = None) -> CheckpointRef:
        """Wait until every chunk is packed: the source directory may then change or
        go.

        Args:
            timeout: Seconds to wait at most (default: as long as it takes).

        Returns:
            ``ref``, the ObjectRef of the transferred checkpoint.

        Raises:
            SourceChangedError: A file changed while it was packed.
            PermissionError: A file could not be read.
            CheckpointLostError: The packing's owner died, or the Ray session ended
                first.
            TimeoutError: ``timeout`` passed first.
        """
        self._wait(timeout)
        # The outcome without raising the stored error (raised, its traceback would
        # hold this frame, and so this future and the error each other): a copy.
        error = super().exception(0)
        if error is None:
            return self._ref
        if isinstance(error, RAY_ERRORS):
            raise_transfer_error(None, "the packing of a checkpoint", error)
        raise fresh(error) from None

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error ``result()`` would raise.

        Args:
            timeout: Seconds to wait at most (default: as long as it takes).

        Returns:
            That error, or None once packed.

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        self._wait(timeout)
        try:
            self.result(0)
        except Exception as e:
            return e.with_traceback(None)
        return None

    def add_done_callback(self, fn: Callable[[TransferFuture], object]) -> None:
        """Call ``fn(self)`` once packing has finished (at once if it has; when the
        session ends first, then), in a thread of Ray's or of this module's.

        Args:
            fn: The callback; an error it raises is logged by ``concurrent.futures``.
        """
        # ``concurrent.futures`` keeps its callbacks after running them: one that held
        # this future would make a cycle (future -> callbacks -> future) that keeps
        # the checkpoint's chunks in the store until the cyclic GC runs, which in an
        # idle process can be many seconds. It holds a box, emptied as it runs.
        box = [fn]
        super().add_done_callback(lambda future: _run_once(box, future))
        if not super().done():
            _watch(self, hold=True)  # its callbacks run even if nobody keeps it

    def set_result(self, result: CheckpointRef) -> None:
        """Refused: the transfer's completion sets it.

        Args:
            result: Ignored.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(f"{self!r} is completed by its transfer, not by set_result")

    def set_exception(self, exception: BaseException | None) -> None:
        """Refused: the transfer's completion sets it.

        Args:
            exception: Ignored.

        Raises:
            RuntimeError: Always.
        """
        raise RuntimeError(f"{self!r} is completed by its transfer, not by set_exception")

    def _settle(self, ray_future: concurrent.futures.Future[tuple[Status, ...]]) -> None:
        """Ray's future completed (in a thread of Ray's): the same outcome here."""
        try:
            error = ray_future.exception()
        except concurrent.futures.CancelledError as e:  # not by us: say so
            error = CheckpointLostError(f"the completion of {self!r} was cancelled: {e!r}")
        self._complete(error)

    def _wait(self, timeout: float | None) -> None:
        """Return once done, checking the session every ``KNOBS.session_poll_s``;
        TimeoutError after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(
                    f"{self!r}: packing still running after {timeout} s; call result() "
                    "again to keep waiting"
                )
            poll = KNOBS.session_poll_s if left is None else min(left, KNOBS.session_poll_s)
            concurrent.futures.wait([self], timeout=poll)

    def _check_session(self) -> None:
        """Fail the future if the Ray session it was started in has ended."""
        if super().done() or session() == self._session:
            return
        self._complete(
            CheckpointLostError(
                "the Ray session this checkpoint was being packed in ended "
                "(ray.shutdown()) before packing finished, and its chunks went with it: "
                "transfer the checkpoint again in the current session"
            )
        )

    def __reduce__(self) -> NoReturn:
        # Its completion lives in this process (a concurrent.futures.Future); what
        # travels to tasks and actors is the ref.
        raise TypeError(
            f"{self!r} cannot be pickled or passed to a task or actor: pass its .ref "
            "(the checkpoint's ObjectRef, usable before packing is done) instead"
        )

    def __repr__(self) -> str:
        state = "done" if super().done() else "packing"
        # The whole id: the first 16 hex digits are the same for every ray.put.
        return f"TransferFuture({state}, ref={self._ref.hex()})"


def session() -> tuple[str, str] | None:
    """Which Ray session this process is connected to (GCS address and job: a new
    ``ray.init`` is a new job, a new local Ray a new address), or None."""
    if not ray.is_initialized():
        return None
    try:
        context = ray.get_runtime_context()
        return str(context.gcs_address), str(context.get_job_id())
    except Exception:  # shutting down meanwhile
        return None


def _run_once(
    box: list[Callable[[TransferFuture], object]], future: concurrent.futures.Future[CheckpointRef]
) -> None:
    """Call the callback in ``box`` with ``future`` and empty it (see
    ``add_done_callback``)."""
    if box:
        box.pop()(cast(TransferFuture, future))  # the one it was added to


#: Pending futures whose sessions the watcher checks: held (they have callbacks to
#: run), or only while someone else holds them (a waiter: dropped, nobody waits).
_held: set[TransferFuture] = set()
_watched: weakref.WeakSet[TransferFuture] = weakref.WeakSet()
_watched_lock = threading.Lock()


def _watch(future: TransferFuture, hold: bool) -> None:
    """Check ``future``'s session every ``KNOBS.session_poll_s`` until it is done, on
    one daemon thread for all such futures, so that waiters (``concurrent.futures.wait``
    reads a future's state without asking it) and callbacks see the end of a session
    even when nobody calls the future. ``hold``: keep it alive until then."""
    with _watched_lock:
        (_held if hold else _watched).add(future)
    _watcher.start()


def _check_sessions() -> None:
    with _watched_lock:
        pending = [*_held, *_watched]
    for future in pending:
        future.done()  # fails it if its session ended
    with _watched_lock:
        finished = [f for f in pending if f.done()]
        _held.difference_update(finished)
        for future in finished:
            _watched.discard(future)


def _none_watched() -> bool:
    with _watched_lock:  # the thread ends, and the next _watch starts another
        return not _held and not _watched


_watcher = Periodic(
    "air-transfer-futures", lambda: KNOBS.session_poll_s, _check_sessions, _none_watched
)
