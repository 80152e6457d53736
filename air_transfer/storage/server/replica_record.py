"""Node storage replicas, the record a registry keeps of one storage, as data: its
copies, which are fresh, the operations in flight, the repairs that failed, and how
it is saved.

The registry saves a storage's record (``Replicated.to_record``) before any call
that changed it returns, to a ``Store`` that outlives the registry's process (the
cluster's GCS key-value store: ``replica_host``), and a registry started again
loads every record back (``Replicated.from_record``). What is not saved is what a
new registry must redo anyway: the copies being re-made (their repair died with
the old registry, so they stay stale until repaired again), the paths written
meanwhile, and the callers waiting for a path (they ask again). Operations in
flight are saved, with the process that runs each, so that their ``end`` (retried
by the writer on the new registry) still counts a copy that missed them, commits
of one path stay one at a time, no copy is made fresh while one of them is running,
and one whose process died is resolved (``dead_ops``).

Every part is a dataclass with ``to_dict``/``from_dict``; a field added later gets
a default, so that records saved before it still load.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from air_transfer.storage.replica_wire import Owner

#: The version of a saved record; a record of another is refused (never guessed).
#: Version 1 (no owners, no failures) loads with neither.
RECORD_VERSION = 2
_READS = (1, 2)
#: How long an operation whose process is not known (a version 1 record) may hold
#: its paths before the registry takes its writer for dead.
BUSY_S = 300.0
#: Repairs of one copy that may fail in a row before repair gives up on it.
MAX_ATTEMPTS = 3


@dataclass
class Op:
    """One operation in flight: the copies it goes to, which of them were fresh,
    the paths it changes, when it began (wall clock: it outlives a process), the
    process that runs it, and its staging file on each copy (a file's commit)."""

    targets: list[str]
    fresh: list[str]
    paths: list[str]
    started: float
    owner: Owner | None = None
    staging: dict[str, str] = field(default_factory=dict)

    def expired(self, now: float) -> bool:
        """Taken for dead by age alone: only an operation whose process is unknown."""
        return self.owner is None and now - self.started > BUSY_S

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)  # the owner's too

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Op:
        owner = d.get("owner")
        return cls(
            targets=[str(n) for n in d["targets"]],
            fresh=[str(n) for n in d["fresh"]],
            paths=[str(p) for p in d["paths"]],
            started=float(d["started"]),
            owner=None if owner is None else Owner.from_dict(owner),
            staging={str(n): str(s) for n, s in d.get("staging", {}).items()},
        )


@dataclass
class Failure:
    """Repairs of one copy that failed in a row: how many, the last error, when."""

    attempts: int
    error: str
    last: float  # wall clock

    @property
    def given_up(self) -> bool:
        return self.attempts >= MAX_ATTEMPTS

    def retry_at(self) -> float:
        """When the next repair of it may start: 2 s, 4 s... after the last."""
        return self.last + min(60.0, 2.0**self.attempts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Failure:
        return cls(attempts=int(d["attempts"]), error=str(d["error"]), last=float(d["last"]))


@dataclass
class Replicated:
    """The state of one replicated storage."""

    wanted: int  # K: how many complete copies it should have
    roots: dict[str, str]  # node -> root, for every member copy
    fresh: set[str]
    template: str  # the root of a copy on a node that joins later ({node_id})
    syncing: dict[str, set[str]] = field(default_factory=dict)  # node -> paths touched
    ops: dict[str, Op] = field(default_factory=dict)  # op id -> in flight
    nbytes: int = 0  # what the storage holds, as its last repair or write counted
    failures: dict[str, Failure] = field(default_factory=dict)  # node -> its repairs

    def repairable(self, node: str, now: float) -> bool:
        """Whether repair may make a copy on ``node`` now (not given up on, and its
        last failure, if any, far enough behind)."""
        f = self.failures.get(node)
        return f is None or (not f.given_up and now >= f.retry_at())

    def to_record(self) -> bytes:
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "wanted": self.wanted,
                "roots": self.roots,
                "fresh": sorted(self.fresh),
                "template": self.template,
                "ops": {o: rec.to_dict() for o, rec in self.ops.items()},
                "nbytes": self.nbytes,
                "failures": {n: f.to_dict() for n, f in self.failures.items()},
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_record(cls, data: bytes) -> Replicated:
        """The storage a saved record describes (nothing syncing: see above)."""
        d: dict[str, Any] = json.loads(data)
        if d.get("version") not in _READS:
            raise ValueError(
                f"replica record of version {d.get('version')!r}; this air-transfer "
                f"reads versions {', '.join(map(str, _READS))} only"
            )
        roots = {str(n): str(r) for n, r in d["roots"].items()}
        return cls(
            wanted=int(d["wanted"]),
            roots=roots,
            fresh={str(n) for n in d["fresh"]} & set(roots),
            template=str(d["template"]),
            ops={str(o): Op.from_dict(rec) for o, rec in d["ops"].items()},
            nbytes=int(d["nbytes"]),
            failures={str(n): Failure.from_dict(f) for n, f in d.get("failures", {}).items()},
        )


class Store(Protocol):
    """Where records are saved, by storage key."""

    def save(self, key: str, record: bytes) -> None: ...
    def load_all(self) -> dict[str, bytes]: ...
