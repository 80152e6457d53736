"""One transfer as this process sees it: its progress bar and its metrics together.

The Ray-side layers wrap what they already do with a ``Transfer`` (reading in
``TransferHandle.write_to``, packing in ``ChunkedCheckpoint.to_object_ref_async``,
node storage's uploads and reads) instead of reaching into the Ray-free core: the
writer only sees an iterator of chunks, and ``Transfer.chunks`` counts each one
when the writer asks for the next (by then it is checked and written).

Usage, for any transfer of known size (node storage included)::

    with Transfer("upload", strategy="node_storage", total=size, desc=f"upload {name}",
                  progress=config.progress) as transfer:
        for chunk in chunks:
            send(chunk)
            transfer.advance(len(chunk))

or ``transfer = Transfer(...).start()`` and ``transfer.finish(error)`` where the
transfer is not one block (a file object written in many calls, closed later).
"""

from __future__ import annotations

import concurrent.futures
import errno
import logging
import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from types import TracebackType
from typing import TypeVar

import ray

from air_transfer.cluster.fetch import get, innermost
from air_transfer.cluster.refs import DoneRef, PendingChecksum, Status
from air_transfer.core.knobs import KNOBS
from air_transfer.core.threads import start_daemon
from air_transfer.errors import ChecksumError
from air_transfer.observe import deferred, metrics
from air_transfer.observe.metrics import ByteCounter, Phase
from air_transfer.observe.progress import Bar, progress_enabled

T = TypeVar("T")

logger = logging.getLogger(__name__)

#: The ``strategy`` tag of node storage's own transfers (files read and written
#: through ``storage_filesystem()``, Ray Train's copies on the storage node).
NODE_STORAGE = "node-storage"

#: Which byte counter ``advance`` adds to, by phase: packed bytes are counted where
#: packing runs (the node agent), not by the process waiting for it.
PHASE_BYTES: dict[str, ByteCounter | None] = {
    "pack": None,
    "read": "written",
    "upload": "written",
    "download": "fetched",
}


class Transfer:
    """A transfer of ``total`` bytes (None: unknown) in ``phase``, for the metrics
    (duration, in-flight, failures, and the phase's byte counter: ``PHASE_BYTES``)
    and, where ``progress`` (see ``progress.progress_enabled``) allows, a bar
    labelled ``desc``, drawn once the transfer has run for ``delay`` seconds."""

    def __init__(
        self,
        phase: Phase,
        *,
        strategy: str,
        total: int | None,
        desc: str,
        progress: bool | None = None,
        delay: float | None = None,
    ) -> None:
        self.phase: Phase = phase
        self.strategy = strategy
        self.total = total
        self.desc = desc
        self.counter = PHASE_BYTES[phase]
        self.bar: Bar | None = None
        self._show = progress
        self._delay = KNOBS.progress_delay_s if delay is None else delay
        self._started: float | None = None
        self._finished = False

    def start(self, at: float | None = None) -> Transfer:
        """Start the clock (or set it to ``at``, a ``time.monotonic()`` of the
        past), count the transfer in flight, and prepare its bar."""
        self._started = time.monotonic() if at is None else at
        metrics.in_flight(self.phase, self.strategy, 1)
        try:
            if progress_enabled(self._show):
                self.bar = Bar(self.desc, self.total, self._delay)
        except Exception as e:  # e.g. a stderr that cannot say whether it is a tty
            logger.debug("air-transfer: no progress bar for %r: %r", self.desc, e)
        return self

    def advance(self, nbytes: int) -> None:
        """``nbytes`` more transferred: call once per chunk, never per byte."""
        if self.bar is not None:
            self.bar.update(nbytes)
        if self.counter is not None:
            metrics.add_bytes(self.counter, nbytes, self.strategy)

    def finish(self, error: BaseException | None = None) -> None:
        """The transfer ended, successfully or with ``error``; only the first call
        counts. GeneratorExit is no failure: a generator of chunks closed by a reader
        that stopped early (a partial read of a file) ended normally."""
        if self._finished or self._started is None:
            return
        if isinstance(error, GeneratorExit):
            error = None
        self._finished = True
        if self.bar is not None:
            self.bar.close()
        metrics.in_flight(self.phase, self.strategy, -1)
        if error is None:
            metrics.duration(self.phase, self.strategy, time.monotonic() - self._started)
            return
        if isinstance(error, ChecksumError):
            metrics.checksum_failure(self.strategy)
        metrics.failed(self.phase, self.strategy, error_name(error))

    def chunks(
        self, chunks: Iterator[T], length: Callable[[int], int], verified: bool
    ) -> Generator[T, None, None]:
        """``chunks`` again, advancing by chunk ``i``'s ``length(i)``, and counting it
        verified if ``verified``, when the consumer asks for the chunk after it or the
        end: a writer that asks for chunk ``i + 1`` has checked and written chunk
        ``i``. Closing this closes ``chunks``."""
        index = -1
        try:
            for index, chunk in enumerate(chunks):
                if index:
                    self._chunk_done(index - 1, length, verified)
                yield chunk
            if index >= 0:
                self._chunk_done(index, length, verified)
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()

    def _chunk_done(self, index: int, length: Callable[[int], int], verified: bool) -> None:
        try:
            self.advance(length(index))
        except Exception as e:  # an index the manifest does not have: the writer says so
            logger.debug("air-transfer: chunk %d not counted: %r", index, e)
            return
        if verified:
            metrics.chunks_verified(1, self.strategy)

    def __enter__(self) -> Transfer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.finish(exc)


def dropped_error(path: str) -> OSError:
    """What a write stream dropped unclosed counts as: a failed transfer (its bytes
    were never stored)."""
    return OSError(errno.EIO, "dropped before close: not stored", path)


def finish_soon(transfer: Transfer, error: BaseException | None) -> None:
    """Finish ``transfer`` with ``error`` on the deferred-work thread: for finalizers
    (``observe.deferred``). Call ``deferred.start()`` first, outside any finalizer."""
    deferred.later(lambda: transfer.finish(error))


def error_name(error: BaseException) -> str:
    """The class name of what a transfer raised, Ray's task wrappers taken off."""
    return type(innermost(error)).__name__


def describe(path: str | os.PathLike[str], verb: str) -> str:
    """A bar's label: ``verb`` and the last component of ``path``."""
    name = os.path.basename(os.path.normpath(os.fspath(path))) or os.fspath(path)
    return f"{verb} {name}"


# -- packing, watched from the caller ---------------------------------------------------


class PackWatch:
    """The bar of one packing, seen from the caller: waits ``delay`` seconds for the
    completion ``done``; if packing is still running then, asks ``load`` for each
    chunk's length and checksum ref (a checksum resolves when its chunk is packed)
    and advances a bar as they resolve. Run it inline (``run``, for
    ``to_object_ref``) or on a daemon thread (``start``, for ``to_object_ref_async``).
    Any error ends the watch, never the transfer: the future reports it."""

    def __init__(
        self,
        desc: str,
        done: DoneRef | concurrent.futures.Future[DoneRef | None],
        load: Callable[[], tuple[Sequence[int], Sequence[PendingChecksum]]],
        delay: float | None = None,
    ) -> None:
        self.desc = desc
        self.done = done
        self.load = load
        self.delay = KNOBS.progress_delay_s if delay is None else delay
        self.bar: Bar | None = None

    def start(self) -> threading.Thread:
        return start_daemon("air-transfer-progress", self.run)

    def run(self) -> None:
        try:
            done = self.done
            if isinstance(done, concurrent.futures.Future):  # still being submitted
                submitted = done.result()
                if submitted is None:  # nothing left to pack
                    return
                done = submitted
            ready, _ = ray.wait([done], timeout=self.delay, fetch_local=False)
            if ready:
                return
            lengths, checksums = self.load()
            self.bar = Bar(self.desc, sum(lengths), delay=0.0)
            for length, checksum in zip(lengths, checksums, strict=True):
                value = get(checksum) if isinstance(checksum, ray.ObjectRef) else checksum
                if isinstance(value, BaseException):  # packing failed
                    return
                self.bar.update(length)
        except Exception as e:
            logger.debug("air-transfer: stopped the progress of %r: %r", self.desc, e)
        finally:
            if self.bar is not None:
                self.bar.close()


def packing(strategy: str, done: DoneRef | None, started: float) -> Transfer:
    """The metrics of one packing (a ``Transfer`` of phase ``pack``, no bar: the
    caller's ``PackWatch`` draws it), started at ``started`` (``time.monotonic``)
    and finished when ``done`` resolves (at once if None)."""
    transfer = Transfer("pack", strategy=strategy, total=None, desc="", progress=False)
    transfer.start(at=started)
    if done is None:
        transfer.finish()
        return transfer

    def finished(future: concurrent.futures.Future[tuple[Status, ...]]) -> None:
        try:
            transfer.finish(future.exception())
        except Exception as e:  # a cancelled future, a Ray shutting down
            logger.debug("air-transfer: packing metrics lost: %r", e)

    try:
        done.future().add_done_callback(finished)
    except Exception as e:
        logger.debug("air-transfer: packing metrics lost: %r", e)
    return transfer
