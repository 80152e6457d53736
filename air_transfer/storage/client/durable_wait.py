"""Waiting for node storage's durable tier, from the caller's side: until everything
acknowledged is there, confirmed in the tier (``wait_until_durable``, the end of a
run), until a report may go on (``admitted``, ``max_lag_bytes``), and where a path
stands now (``durable_now``).

The agent of the copy that leads the drain (``storage.server.drain``) answers; which
copy that is, is asked again at every poll (``where``), and a copy that went away
mid-wait (its node lost) is followed to the one that leads next. A drain that
started again (its agent restarted) voids a ticket: a new one is asked for. Polling
starts every 50 ms and backs off to 1 s.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Literal

from air_transfer.observe.progress import make_bar, progress_enabled
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.durable.status import DrainStatus
from air_transfer.storage.node_api import NodeDurable

logger = logging.getLogger(__name__)
#: Polling of the drain's status: first and longest interval (seconds).
POLL_S = (0.05, 1.0)
#: A wait shows a bar when this many bytes are still to go (and bars are on).
BAR_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class StorageState:
    """Where a path of node storage stands.

    Attributes:
        path: the path asked about.
        copies: how many nodes hold it in node storage (0: only the durable tier).
        durable: whether every file at or under it is in the durable tier as node
            storage holds it now, asked of the tier itself (None: the storage has no
            durable tier).
    """

    path: str
    copies: int
    durable: bool | None

    @property
    def tier(self) -> Literal["local", "replicated", "durable"]:
        """The safest place it is kept: ``durable`` (it outlives the cluster),
        ``replicated`` (on more than one node), else ``local``."""
        if self.durable:
            return "durable"
        return "replicated" if self.copies > 1 else "local"


#: Where a storage's drain runs: ``(node, root of its copy there, link to its agent)``;
#: asked again while waiting, since the copy that drains may change.
DrainPoint = tuple[str, str, AgentLink]


def _at(root: str, rel: str | None) -> str | None:
    return None if rel is None else posixpath.join(root, rel) if rel else root


def wait_until_durable(
    where: Callable[[], DrainPoint], rel: str | None, uri: str, timeout: float | None
) -> None:
    """Return once a drain pass that started after this call confirmed everything in
    the tier and ended well, and no delete is pending (or, for ``rel``, a path
    relative to the root, once every file at or under it is confirmed there and no
    delete is pending); TimeoutError after ``timeout`` seconds naming what is still
    missing."""
    deadline = None if timeout is None else time.monotonic() + timeout
    point: tuple[str, str] | None = None
    epoch, ticket = "", 0
    delay, bar, shown, last_seen = POLL_S[0], None, 0, None
    try:
        while True:
            try:
                node, root, link = where()
                if (node, root) != point:  # another copy leads the drain now
                    point = (node, root)
                    epoch, ticket = link.call(NodeDurable.durable_request, root, True)
                status = link.call(NodeDurable.durable_status, root, _at(root, rel))
                last_seen = status
                if status.epoch != epoch:  # the drain started again: the ticket is void
                    epoch, ticket = link.call(NodeDurable.durable_request, root, True)
                    continue
                if status.confirmed >= ticket and not status.deletes_pending:
                    return
                if rel is not None and status.durable and not status.deletes_pending:
                    confirmed = link.call(NodeDurable.durable_status, root, _at(root, rel), True)
                    if confirmed.durable:
                        return
            except ConnectionError as e:  # the copy that led went away: ask again
                point = None
                logger.debug("air-transfer: the drain's copy went away (%s); following", e)
            lag = last_seen.lag_bytes if last_seen is not None else 0
            if bar is None and lag >= BAR_BYTES and progress_enabled(None):
                bar, shown = make_bar(f"durable {uri}", lag, 0), lag
            if bar is not None and lag < shown:
                bar.update(shown - lag)
                shown = lag
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(_missing(uri, timeout, last_seen))
            time.sleep(
                delay if deadline is None else max(0.0, min(delay, deadline - time.monotonic()))
            )
            delay = min(delay * 2, POLL_S[1])
    finally:
        if bar is not None:
            bar.close()


def durable_now(where: Callable[[], DrainPoint], rel: str) -> bool:
    """Whether every file at or under ``rel`` is in the durable tier as node storage
    holds it now, asked of the tier itself."""
    _, root, link = where()
    return bool(link.call(NodeDurable.durable_status, root, _at(root, rel), True).durable)


@contextmanager
def admitted(where: Callable[[], DrainPoint], nbytes: int, limit: int, uri: str) -> Iterator[None]:
    """Hold a report of ``nbytes`` until the bytes not yet in the durable tier, with
    it, stay within ``limit`` (``max_lag_bytes``; a report larger than the limit
    waits until nothing else is behind), then reserve its room until it is stored."""
    delay, logged = POLL_S[0], False
    while True:
        _, root, link = where()
        key = link.call(NodeDurable.durable_admit, root, nbytes)
        if key is not None:
            break
        if not logged:
            logged = True
            status = link.call(NodeDurable.durable_status, root)
            logger.warning(
                "air-transfer: a report of %d bytes waits: %d bytes of node storage %s are "
                "not in the durable tier %s yet, max_lag_bytes=%d (last error: %s)",
                nbytes, status.lag_bytes, root, uri, limit, status.last_error,
            )  # fmt: skip
        time.sleep(delay)
        delay = min(delay * 2, POLL_S[1])
    if logged:
        logger.info("air-transfer: the durable tier %s caught up; the report goes on", uri)
    try:
        yield
    finally:
        with suppress(ConnectionError):  # the agent went: its reservations with it
            link.call(NodeDurable.durable_release, root, key)


def _missing(uri: str, timeout: float | None, status: DrainStatus | None) -> str:
    if status is None:
        return f"the durable tier {uri}: no copy of node storage answered for {timeout} s"
    pending = ", ".join(status.pending) or "(files not yet scanned)"
    stuck = "; ".join(f"{p}: {why}" for p, why in status.stuck[:3]) or "none"
    waiting = "; ".join(f"{p} ({why})" for p, why in status.deletes_waiting[:3])
    return (
        f"the durable tier {uri} does not hold everything node storage had acknowledged "
        f"after {timeout} s: {status.lag_bytes} bytes still to upload (first: {pending}), "
        f"{status.deletes_pending} deletes pending{f': {waiting}' if waiting else ''}; "
        f"stuck: {stuck}; last error: {status.last_error or 'none'}"
    )
