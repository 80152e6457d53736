"""Where a storage's drain into the durable tier is, as its agent answers a caller
(``NodeDurable.durable_status``): declared below both rooms, which pass it along."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DrainStatus:
    """Where one storage's drain is. ``epoch`` changes when the drain starts again
    (its agent restarted): a ticket of another epoch is void."""

    epoch: str
    requested: int
    completed: int
    lag_bytes: int
    pending: tuple[str, ...]
    uploaded_bytes: int
    copied_bytes: int
    errors: int
    last_error: str | None
    passes: int
    deletes_pending: int
    #: For a status of one path: whether every file at or under it is in the tier.
    durable: bool | None = None
    #: The last ticket completed by a pass that confirmed everything in the tier.
    confirmed: int = 0
    #: Files that did not reach the tier at the last try, and why (the first ones).
    stuck: tuple[tuple[str, str], ...] = ()
    #: How fast the last pass that sent anything sent it (bytes per second).
    bytes_per_s: float = 0.0
    #: Deletes that wait, and why (the first ones).
    deletes_waiting: tuple[tuple[str, str], ...] = ()
