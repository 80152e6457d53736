"""Node storage with ``placement="writer"``, when the replica registry runs its
background pass over placed files (``replica_wire.PLACED_PASS``): a decision, as
data, from the nodes the pass saw and what it failed on (``PlacedSchedule``).

Not every tick: a pass lists every storage's tree. It runs when the set of live or
draining nodes changes; once more ``RECHECK_S`` later (a write in flight at the
change may publish a file naming a node that went meanwhile), and every
``RECHECK_S`` while a node is draining (its deadline is near, and such writes keep
landing until it goes). After a pass that failed on some file, again after a
backoff (``FIRST_RETRY_S``, doubling up to ``MAX_RETRY_S``), at most
``MAX_ATTEMPTS`` times for the same nodes; then no more until the nodes change,
the files named in an error logged by the caller.

The sweep of orphan placed blobs whose writer died (``SweepSchedule``) keeps its own
pace: at a change of the live nodes and every ``AIR_TRANSFER_PLACED_SWEEP_S``. Plain
Python.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from air_transfer.core import environ

#: A pass after a change of nodes, and while one drains: seconds between.
RECHECK_S = 5.0
#: The first wait after a failed pass (seconds), doubled at each failure after it.
FIRST_RETRY_S = 1.0
#: The longest wait between two passes that fail (seconds).
MAX_RETRY_S = 60.0
#: Passes that fail in a row, for the same nodes, before the schedule gives up.
MAX_ATTEMPTS = 8

#: The nodes a pass sees: (live, draining).
Nodes = tuple[frozenset[str], frozenset[str]]


@dataclass
class PlacedSchedule:
    """Whether a pass is due now, from the nodes and the last pass's outcome."""

    seen: Nodes | None = None  # the nodes the last pass saw
    next_at: float | None = None  # when the next pass is due if the nodes stay
    failures: int = 0  # passes that failed in a row for ``seen``

    def due(self, nodes: Nodes, now: float) -> bool:
        return nodes != self.seen or (self.next_at is not None and now >= self.next_at)

    def ran(self, nodes: Nodes, now: float, failed: list[str]) -> bool:
        """Note a pass over ``nodes`` that failed on ``failed`` (none: it succeeded);
        True when the schedule gives up on them until the nodes change."""
        changed = nodes != self.seen
        self.seen = nodes
        if changed:
            self.failures = 0
        if not failed:
            self.failures = 0
            recheck = changed or bool(nodes[1])
            self.next_at = now + RECHECK_S if recheck else None
            return False
        self.failures += 1
        if self.failures >= MAX_ATTEMPTS:
            self.next_at = None
            return True
        self.next_at = now + min(MAX_RETRY_S, FIRST_RETRY_S * 2 ** (self.failures - 1))
        return False


#: Seconds between background sweeps of orphan placed blobs, unless the setting says.
SWEEP_S = 60.0
#: The least seconds between two background sweeps, even as nodes keep changing.
SWEEP_MIN_GAP_S = 5.0


def sweep_every_s() -> float:
    """``AIR_TRANSFER_PLACED_SWEEP_S`` (seconds; 0: no background sweep), else
    ``SWEEP_S``; ValueError naming the setting for anything else."""
    raw = os.environ.get(environ.PLACED_SWEEP_S, "")
    try:
        every = float(raw) if raw else SWEEP_S
    except ValueError:
        every = -1.0
    if not every >= 0 or every == float("inf"):
        raise ValueError(
            f"{environ.PLACED_SWEEP_S}={raw!r}: seconds between background sweeps of "
            "orphan placed blobs, 0 or more (0: none)"
        )
    return every


@dataclass
class SweepSchedule:
    """When the registry's background sweep of orphan placed blobs runs
    (``replica_wire.PLACED_SWEEP``): at a change of the live nodes (a node gone takes
    its writers with it), and every ``every_s`` seconds (a writer killed on a node
    that stays), never twice within ``SWEEP_MIN_GAP_S``; never with ``every_s`` 0.
    A sweep that finds no dead writer lists two directories per node, no stub."""

    every_s: float
    seen: frozenset[str] | None = None  # the live nodes at the last sweep
    last: float | None = None  # when it ran

    def due(self, live: frozenset[str], now: float) -> bool:
        if self.every_s <= 0:
            return False
        if self.last is None:
            return True
        since = now - self.last
        changed = live != self.seen and since >= min(SWEEP_MIN_GAP_S, self.every_s)
        return changed or since >= self.every_s

    def ran(self, live: frozenset[str], now: float) -> None:
        self.seen, self.last = live, now
