"""Waiting for node storage's durable tier, from the caller's side: until everything
acknowledged is there (``wait_durable``, the end of a run), until a report may go on
(``wait_for_lag``, ``max_lag_bytes``), and where a path stands now
(``storage_state``).

The storage node's agent drains (``storage.server.drain``); a caller asks it for a
ticket and polls its status until a pass that started after the ticket ended well.
A drain that started again (its agent restarted) voids the ticket: a new one is
asked for. Polling starts every 50 ms and backs off to 1 s.
"""

from __future__ import annotations

import logging
import posixpath
import time
from collections.abc import Callable
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
    """Where a path of node storage stands: ``copies``, how many nodes hold it in node
    storage (0: only the durable tier holds it); ``durable``, whether every file at or
    under it is in the durable tier as node storage holds it now (None: the storage
    has no durable tier)."""

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


def _request(link: AgentLink, root: str) -> tuple[str, int]:
    """``(epoch, ticket)`` of the drain of ``root`` (``Drainer.request``)."""
    result: tuple[str, int] = link.call(NodeDurable.durable_request, root)
    return result


def _status(link: AgentLink, root: str, at: str | None = None) -> DrainStatus:
    """The drain's ``DrainStatus`` (looking at ``at`` now, if given)."""
    return link.call(NodeDurable.durable_status, root, at)


def wait_until_durable(
    where: Callable[[], DrainPoint], rel: str | None, uri: str, timeout: float | None
) -> None:
    """Return once the drain of the storage completed a pass that started after
    this call (or, for ``rel``, a path relative to the root, once every file at or
    under it is there and no delete is pending); TimeoutError after ``timeout``
    seconds naming what is still missing. ``where`` says which agent drains: a
    drain that changed (another copy leads, or its agent restarted) is asked for a
    new ticket."""
    deadline = None if timeout is None else time.monotonic() + timeout
    node, root, link = where()
    epoch, ticket = _request(link, root)
    delay, bar, shown = POLL_S[0], None, 0
    try:
        while True:
            now_at = where()
            if now_at[:2] != (node, root):  # another copy leads the drain now
                node, root, link = now_at
                epoch, ticket = _request(link, root)
            status = _status(link, root, _at(root, rel))
            if status.epoch != epoch:  # the drain started again: its old tickets are void
                epoch, ticket = _request(link, root)
                continue
            if status.completed >= ticket or (
                rel is not None and status.durable and not status.deletes_pending
            ):
                return
            if bar is None and status.lag_bytes >= BAR_BYTES and progress_enabled(None):
                bar, shown = make_bar(f"durable {uri}", status.lag_bytes, 0), status.lag_bytes
            if bar is not None and status.lag_bytes < shown:
                bar.update(shown - status.lag_bytes)
                shown = status.lag_bytes
            if deadline is not None and time.monotonic() >= deadline:
                now = _status(link, root, _at(root, rel) or root)
                raise TimeoutError(_missing(uri, root, timeout, now))
            time.sleep(delay if deadline is None else min(delay, deadline - time.monotonic()))
            delay = min(delay * 2, POLL_S[1])
    finally:
        if bar is not None:
            bar.close()


def durable_now(where: Callable[[], DrainPoint], rel: str) -> bool:
    """Whether every file at or under ``rel`` is in the durable tier as node storage
    holds it now."""
    _, root, link = where()
    return bool(_status(link, root, _at(root, rel)).durable)


def wait_for_lag(where: Callable[[], DrainPoint], limit: int, uri: str) -> None:
    """Return once at most ``limit`` bytes of the storage are not yet in its durable
    tier (a report's backpressure, ``max_lag_bytes``)."""
    delay, logged = POLL_S[0], False
    while True:
        _, root, link = where()
        status = _status(link, root)
        if status.lag_bytes <= limit:
            if logged:
                logger.info("air-transfer: the durable tier %s caught up; reports go on", uri)
            return
        if not logged:
            logged = True
            logger.warning(
                "air-transfer: a report waits: %d bytes of node storage %s are not in the "
                "durable tier %s yet, more than max_lag_bytes=%d (last error: %s)",
                status.lag_bytes, root, uri, limit, status.last_error,
            )  # fmt: skip
        time.sleep(delay)
        delay = min(delay * 2, POLL_S[1])


def _missing(uri: str, root: str, timeout: float | None, status: DrainStatus) -> str:
    pending = ", ".join(status.pending) or "(files not yet scanned)"
    return (
        f"the durable tier {uri} does not hold everything node storage {root} had "
        f"acknowledged after {timeout} s: {status.lag_bytes} bytes still to upload "
        f"(first: {pending}), {status.deletes_pending} deletes pending; last error: "
        f"{status.last_error or 'none'}"
    )
