"""Node storage replicas, the record a registry keeps of one storage, as data: its
copies, which are fresh, the operations in flight, and how it is saved.

The registry saves a storage's record (``Replicated.to_record``) before any call
that changed it returns, to a ``Store`` that outlives the registry's process (the
cluster's GCS key-value store: ``replica_host``), and a registry started again
loads every record back (``Replicated.from_record``). What is not saved is what a
new registry must redo anyway: the copies being re-made (their repair died with
the old registry, so they stay stale until repaired again) and the paths written
meanwhile. Operations in flight are saved, so that their ``end`` (retried by the
writer on the new registry) still counts a copy that missed them, commits of one
path stay one at a time, and no copy is made fresh while one of them is running.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

#: The version of a saved record; a record of another is refused (never guessed).
RECORD_VERSION = 1
#: How long an operation may hold its paths (and count as in flight) before the
#: registry takes its writer for dead.
BUSY_S = 300.0


@dataclass
class Op:
    """One operation in flight: the copies it goes to, which of them were fresh,
    the paths it changes, and when it began (wall clock: it outlives a process)."""

    targets: list[str]
    fresh: list[str]
    paths: list[str]
    started: float

    def expired(self, now: float) -> bool:
        return now - self.started > BUSY_S


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

    def live_ops(self) -> dict[str, Op]:
        """The operations in flight, those whose writer is taken for dead dropped."""
        now = time.time()
        for op in [o for o, rec in self.ops.items() if rec.expired(now)]:
            del self.ops[op]
        return self.ops

    def to_record(self) -> bytes:
        return json.dumps(
            {
                "version": RECORD_VERSION,
                "wanted": self.wanted,
                "roots": self.roots,
                "fresh": sorted(self.fresh),
                "template": self.template,
                "ops": {o: asdict(rec) for o, rec in self.ops.items()},
                "nbytes": self.nbytes,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_record(cls, data: bytes) -> Replicated:
        """The storage a saved record describes (nothing syncing: see above)."""
        d: dict[str, Any] = json.loads(data)
        if d.get("version") != RECORD_VERSION:
            raise ValueError(
                f"replica record of version {d.get('version')!r}; this air-transfer "
                f"reads version {RECORD_VERSION} only"
            )
        roots = {str(n): str(r) for n, r in d["roots"].items()}
        return cls(
            wanted=int(d["wanted"]),
            roots=roots,
            fresh={str(n) for n in d["fresh"]} & set(roots),
            template=str(d["template"]),
            ops={str(o): Op(**rec) for o, rec in d["ops"].items()},
            nbytes=int(d["nbytes"]),
        )


class Store(Protocol):
    """Where records are saved, by storage key."""

    def save(self, key: str, record: bytes) -> None: ...
    def load_all(self) -> dict[str, bytes]: ...
