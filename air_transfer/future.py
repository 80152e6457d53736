"""``TransferFuture``: a transferred checkpoint whose packing may still be running.

``ChunkedCheckpoint.to_object_ref_async`` returns one as soon as the directory is
scanned and one packing task per chunk is submitted: ``ref`` is usable at once by any
reader anywhere (a reader waits for a chunk not yet packed), and the future itself
says when the source directory is no longer needed. It behaves as a
``concurrent.futures.Future`` whose result is ``ref``, built on Ray's own future of
the transfer's completion object.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable
from typing import Any

import ray

from air_transfer.handle import RAY_ERRORS, raise_transfer_error


class TransferFuture:
    """The packing of one checkpoint: ``ref`` now, ``result()`` when the source is
    free (every chunk packed and checksummed), or the error packing raised."""

    def __init__(self, ref: ray.ObjectRef[Any], done: ray.ObjectRef[Any] | None) -> None:
        self._ref = ref
        self._done = done
        if done is None:  # packed already (or by a strategy that packs in the caller)
            self._future: concurrent.futures.Future[Any] = concurrent.futures.Future()
            self._future.set_result(None)
        else:
            self._future = done.future()

    @property
    def ref(self) -> ray.ObjectRef[Any]:
        """The ObjectRef of the transferred checkpoint (a ``ChunkedCheckpoint``):
        pass it to tasks, actors, ``from_object_ref``, before packing is done."""
        return self._ref

    def done(self) -> bool:
        """Whether packing has finished, successfully or not."""
        return self._future.done()

    def result(self, timeout: float | None = None) -> ray.ObjectRef[Any]:
        """Wait until every chunk is packed (the source directory may then change or
        go) and return ``ref``; raise what packing raised (SourceChangedError,
        PermissionError, CheckpointLostError, ...), or TimeoutError after
        ``timeout`` seconds."""
        try:
            self._future.result(timeout)
        except RAY_ERRORS as e:
            raise_transfer_error(None, "the packing of a checkpoint", e)
        return self._ref

    def exception(self, timeout: float | None = None) -> BaseException | None:
        """The error ``result()`` would raise, or None once packed."""
        try:
            self.result(timeout)
        except TimeoutError:
            raise
        except Exception as e:
            return e
        return None

    def add_done_callback(self, fn: Callable[[TransferFuture], object]) -> None:
        """Call ``fn(self)`` once packing has finished (at once if it has), in a
        thread of Ray's; an error ``fn`` raises is logged by ``concurrent.futures``."""
        self._future.add_done_callback(lambda _: fn(self))

    def __reduce__(self) -> Any:
        # Its completion lives in this process (a concurrent.futures.Future); what
        # travels to tasks and actors is the ref (issue 13).
        raise TypeError(
            f"{self!r} cannot be pickled or passed to a task or actor: pass its .ref "
            "(the checkpoint's ObjectRef, usable before packing is done) instead"
        )

    def __repr__(self) -> str:
        state = "packing" if not self.done() else "done"
        # The whole id: the first 16 hex digits are the same for every ray.put.
        return f"TransferFuture({state}, ref={self._ref.hex()})"
