"""Rounds of Ray Train reports committed by their workers, and which one a stopping
worker group's controller must still register. Plain data, no Ray.

A ``SYNC`` report that stored a checkpoint into node storage returns once its round
is committed, without waiting for Train's controller to register it at its next
poll. Every rank, after each report of the round has reached Train (a ``SYNC`` or
``NO_UPLOAD`` report's is in its result queue when the call returns), meets the
others at a barrier; a rank whose report stored a checkpoint then notes the round
``done`` (a ``RoundRecord``) and returns. A round with an ``ASYNC`` report is never
committed (that rank's upload may still run): its ``SYNC`` ranks wait for Train's
registration instead. Rank 0 notes its metrics before the barrier (Train registers
rank 0's), so they are there whenever a round is done. A group of one rank has no one
to meet: its rank notes the round done, with its metrics, at once.

Train takes one report per worker per poll from a queue of one (a worker's next put
waits until its last report was taken), and registers a round in the poll that
takes its last report. So once round *n* is committed every rank has put *n*, every
rank's earlier reports were taken, and every earlier round is registered: at most
the newest committed round can be unregistered when a group stops, and that is the
one ``newest_committed`` names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReportedRound:
    """A worker's report of round ``index``, as Train took it."""

    #: The run's experiment directory (Train's ``experiment_fs_path``).
    run: str
    #: The reporting worker's actor id.
    worker: str
    rank: int
    #: The ranks of its group (1: nobody to meet, nobody else to commit the round).
    world_size: int
    #: Train's report index (the group's first report is ``current_report_index + 1``).
    index: int
    #: The checkpoint this rank's report stored (None: metrics only, or not yet stored).
    path: str | None
    #: Rank 0's metrics of a report that is not ``ASYNC`` (Train registers rank 0's).
    metrics: dict[str, Any] | None
    #: The report's ``validation`` argument, as Train registers it.
    validation: Any
    #: An ``ASYNC`` report: its checkpoint is stored after the call returns.
    in_background: bool = False

    @property
    def promises(self) -> bool:
        """Whether the report promises its checkpoint is restored after a failure from
        the moment it returns (a ``SYNC`` or ``NO_UPLOAD`` report that stored one)."""
        return self.path is not None and not self.in_background


@dataclass(frozen=True)
class RoundRecord:
    """A rank's note that round ``index`` is done: every rank's report of it reached
    Train, and this rank's stored ``path`` (rank 0 alone in its group: its metrics)."""

    index: int
    rank: int
    path: str
    validation: Any
    metrics: dict[str, Any] | None = None


@dataclass(frozen=True)
class CommittedRound:
    """The round a stopping group committed last, with the checkpoint it stored."""

    index: int
    path: str
    metrics: dict[str, Any]
    validation: Any


def record_of(report: ReportedRound) -> RoundRecord:
    """The note a rank whose report ``promises`` makes of its round, done (with rank
    0's metrics when it is alone: nobody else can note the round done before it)."""
    assert report.path is not None
    metrics = report.metrics if report.world_size == 1 else None
    return RoundRecord(report.index, report.rank, report.path, report.validation, metrics)


def newest_committed(
    records: Iterable[RoundRecord], metrics: Mapping[int, dict[str, Any]]
) -> CommittedRound | None:
    """The newest round of ``records`` (one group's), with the lowest rank's path (every
    rank's is the one directory Train named) and validation, and rank 0's metrics of it
    (``metrics``: by round, else in its record; none noted, empty); None without a
    record."""
    records = list(records)
    if not records:
        return None
    newest = max(r.index for r in records)
    first = min((r for r in records if r.index == newest), key=lambda r: r.rank)
    noted = metrics.get(newest, first.metrics if first.rank == 0 else None)
    return CommittedRound(newest, first.path, noted or {}, first.validation)
