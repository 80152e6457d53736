"""The drain's control: one thread per drained root that runs a pass (``passes``) when
node storage changed, when a caller waits for one, when a scrub is due, or every
``rescan_s``; backs off after a failed pass; and drains only while it leads (a copy
of a replicated storage).

What to do next is decided as data (``next_step``) from the state, then done. A
caller gets a ticket (``request``): a pass that started after it and ended without
error completes it; a ticket that asks for confirmation is completed only by a pass
that confirmed everything in the tier first. The status and the lag are read off
node storage when asked (``status``, ``lag_bytes``): a report that landed a moment
ago counts, whatever the pass in flight saw. Plain Python: unit-tested without Ray
(the tombstones and the journal are handed in).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from air_transfer.core.threads import start_daemon
from air_transfer.observe import durable_metrics
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.status import DrainStatus
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.server.drain import passes
from air_transfer.storage.server.drain.confirm import SHOWN
from air_transfer.storage.server.drain.state import background

logger = logging.getLogger(__name__)
#: How long an admitted report's bytes count before they are in node storage.
RESERVATION_S = 600.0
#: How long bytes stay not durable before the drain says it falls behind.
BEHIND_S = 60.0


@dataclass(frozen=True)
class Step:
    """What the loop does next: ``wait`` seconds (woken early by a change unless
    ``backoff``), ``pass_`` (confirming everything first if ``confirm``), or stop."""

    wait: float = 0.0
    backoff: bool = False
    pass_: bool = False
    confirm: bool = False
    stop: bool = False


def next_step(
    *, stop: bool, woken: bool, retry_in: float, leading: bool, confirm_wanted: bool,
    scrub_due: bool, settings: DrainSettings,
) -> Step:  # fmt: skip
    """The loop's decision from its state (see ``Step``): ``retry_in`` is how long a
    failed pass's backoff has still to run."""
    if stop:
        return Step(stop=True)
    if not leading:
        return Step(wait=settings.lead_poll_s, backoff=True)
    if retry_in > 0:
        return Step(wait=retry_in, backoff=True)
    if woken or confirm_wanted or scrub_due:
        return Step(pass_=True, confirm=confirm_wanted or scrub_due)
    return Step(wait=settings.rescan_s)


def backoff_s(failures: int, settings: DrainSettings) -> float:
    """The wait after ``failures`` failed passes in a row: the first, doubling."""
    low, high = settings.backoff_s
    return float(min(low * 2 ** (failures - 1), high))


class Drainer:
    """Runs ``work``, the drain of a node storage root of this node into its durable
    tier (which says the root, the tier, the settings and the tombstones), in a
    thread of its own."""

    def __init__(self, work: passes.Drain, leads: Callable[[], bool] | None = None) -> None:
        self.work = work
        self.root, self.target, self.settings = work.root, work.target, work.settings
        self.tombstones = work.tombstones
        #: Whether this drain leads (a copy of a replicated storage); None: always.
        self.leads = leads
        self.epoch = uuid.uuid4().hex
        self._cond = threading.Condition()
        self._requested = 0
        self._completed = 0
        self._confirm_upto = 0  # the last ticket that asks for confirmation
        self._confirmed = 0  # tickets completed by a confirming pass
        self._wake = True
        self._stop = False
        self._failures = 0
        self._retry_at = 0.0
        self._errors = 0
        self._last_error: str | None = None
        self._passes = 0
        self._scrubbed_at = time.monotonic()
        self._logged: set[str] = set()
        self._reserved: dict[str, tuple[int, float]] = {}
        self._behind_since: float | None = None
        self._behind_logged = False
        self._thread: threading.Thread | None = None

    # -- control ------------------------------------------------------------------------
    def start(self) -> Drainer:
        if self._thread is not None:
            raise RuntimeError("a drain is started once")
        self._thread = start_daemon(f"air-transfer-drain {self.root}", self._run)
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is None:
            raise RuntimeError("a drain is stopped after it is started")
        self._thread.join()

    def touch(self) -> None:
        """Node storage changed: a pass soon."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    def request(self, confirm: bool = False) -> int:
        """A ticket that the next pass to start, once it ends without error, completes
        (with ``confirm``: one that confirmed everything in the tier first)."""
        with self._cond:
            self._requested += 1
            if confirm:
                self._confirm_upto = self._requested
            self._wake = True
            self._cond.notify_all()
            return self._requested

    def retarget(self, target: DurableTarget) -> None:
        """The same tier with the filesystem a caller gave (its credentials)."""
        self.target = target
        self.work.retarget(target)
        self.touch()

    # -- admission (max_lag_bytes) -------------------------------------------------------
    def admit(self, nbytes: int) -> str | None:
        """Reserve ``nbytes`` for a report about to be written if the bytes not yet
        durable, with it, stay within ``max_lag_bytes`` (or nothing else is behind);
        its reservation's key, or None: wait."""
        limit = self.settings.max_lag_bytes
        key = uuid.uuid4().hex
        if limit is None:
            return key
        lag = self.work.lag_bytes()
        with self._cond:
            now = time.monotonic()
            self._reserved = {k: v for k, v in self._reserved.items() if v[1] > now}
            ahead = lag + sum(n for n, _ in self._reserved.values())
            if ahead and ahead + nbytes > limit:
                return None
            self._reserved[key] = (nbytes, now + RESERVATION_S)
        return key

    def release(self, key: str) -> None:
        with self._cond:
            self._reserved.pop(key, None)

    # -- status -------------------------------------------------------------------------
    def status(self, rel: str | None = None, confirm: bool = False) -> DrainStatus:
        """Where the drain is, as node storage stands now. For ``rel`` (a path; ""
        for the root), ``durable`` says whether every file at or under it is in the
        tier as node storage holds it (asked of the tier itself with ``confirm``)."""
        lag, pending, durable = self.work.behind(rel, confirm)
        deletes = len(self.tombstones.pending())
        with self._cond:
            reserved = sum(n for n, _ in self._reserved.values())
            with self.work.lock:
                progress = self.work.progress
                stuck = tuple(sorted(progress.stuck.items()))[:SHOWN]
                uploaded, copied = progress.uploaded, progress.copied
                rate = progress.bytes_per_s
                waiting = tuple(sorted(self.work.waiting_deletes.items()))[:SHOWN]
            return DrainStatus(
                self.epoch, self._requested, self._completed, lag + reserved, pending,
                uploaded, copied, self._errors, self._last_error, self._passes, deletes,
                durable, self._confirmed, stuck, rate, waiting,
            )  # fmt: skip

    # -- the loop -----------------------------------------------------------------------
    def _run(self) -> None:
        background()
        logger.info(
            "air-transfer: node storage %s drains into the durable tier %s", self.root,
            self.target.uri,
        )  # fmt: skip
        while True:
            with self._cond:
                step = self._decide()
                if step.stop:
                    return
                if not step.pass_:
                    if step.backoff:  # a change or a request does not cut it short
                        self._cond.wait_for(lambda: self._stop, timeout=step.wait)
                    else:
                        self._cond.wait_for(lambda: self._stop or self._wake, timeout=step.wait)
                    self._wake = True  # woken, backed off or rescan_s passed: a pass
                    continue
                ticket, self._wake = self._requested, False
            self._pass(ticket, step.confirm)

    def _decide(self) -> Step:
        scrub = self.settings.scrub_s
        now = time.monotonic()
        return next_step(
            stop=self._stop,
            woken=self._wake,
            retry_in=max(0.0, self._retry_at - now),
            leading=self._leading(),
            confirm_wanted=self._confirm_upto > self._confirmed,
            scrub_due=scrub is not None and now - self._scrubbed_at >= scrub,
            settings=self.settings,
        )

    def _pass(self, ticket: int, confirm: bool) -> None:
        try:
            self.work.run(confirm)
        except Exception as e:
            self._failed(e)
            with self._cond:
                self._failures += 1
                self._retry_at = time.monotonic() + backoff_s(self._failures, self.settings)
            self._watch_lag()
            return
        self._watch_lag()
        with self._cond:
            self._failures, self._retry_at = 0, 0.0
            self._completed = max(self._completed, ticket)
            if confirm:
                self._confirmed = max(self._confirmed, ticket)
                self._scrubbed_at = time.monotonic()
            self._passes += 1
            self._cond.notify_all()
        durable_metrics.lag(self.work.lag_bytes())

    def _watch_lag(self) -> None:
        """Say once when bytes stay not durable for ``BEHIND_S`` (the tier is slower
        than the run, or down), and once when it has caught up again."""
        lag = self.work.lag_bytes()
        now = time.monotonic()
        if lag == 0:
            if self._behind_logged:
                logger.info(
                    "air-transfer: the durable tier %s caught up with node storage %s",
                    self.target.uri, self.root,
                )  # fmt: skip
            self._behind_since, self._behind_logged = None, False
            return
        if self._behind_since is None:
            self._behind_since = now
        elif now - self._behind_since >= BEHIND_S and not self._behind_logged:
            self._behind_logged = True
            logger.warning(
                "air-transfer: the durable tier %s falls behind node storage %s: %d bytes "
                "not durable for %.0f s (last error: %s)",
                self.target.uri, self.root, lag, now - self._behind_since, self._last_error,
            )  # fmt: skip

    def _leading(self) -> bool:
        if self.leads is None:
            return True
        try:
            leading = self.leads()
        except Exception as e:  # the record cannot be read now: not leading, for now
            logger.debug("air-transfer: cannot tell whether %s leads its drain: %r", self.root, e)
            leading = False
        if not leading:
            self.work.follow()  # another copy drains: its picture is read again on lead
        return leading

    def _failed(self, e: Exception) -> None:
        said = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
        kind = str(getattr(e, "kind", type(e).__name__))
        with self._cond:
            self._errors += 1
            self._last_error = said
        durable_metrics.upload_error(kind)
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning(
                "air-transfer: the durable tier %s did not take node storage %s's changes "
                "(%s). Reports keep landing in node storage and the drain retries with "
                "backoff; check that the endpoint is up and that the Ray cluster's "
                "processes have its credentials (e.g. AWS_ACCESS_KEY_ID in their "
                "environment). Logged once per kind of error.",
                self.target.uri, self.root, said,
            )  # fmt: skip
