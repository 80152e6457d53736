"""How one file written to every copy of replicated node storage goes on and ends:
``ReplicaWrite``, the replica registry's rules (``upload_copies.CopyRules``) that
``uploads.NodeUpload`` follows for a ``ReplicatedHandler``'s write."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from air_transfer.storage.client import replica_set
from air_transfer.storage.client.replica_set import full, is_lost
from air_transfer.storage.client.upload_copies import Staged, abort_copy
from air_transfer.storage.replica_wire import RegistryCalls


class ReplicatedStorage(Protocol):
    """What a write asks of its storage (``replicas.ReplicatedHandler``)."""

    @property
    def key(self) -> str: ...

    def judge(
        self, outcomes: dict[str, BaseException | None], fresh: list[str]
    ) -> tuple[BaseException | None, list[str]]:
        """The storage's answer and the fresh copies that missed it."""
        ...

    def degraded(self, missed: list[str], rels: list[str]) -> None:
        """Say (and count) that ``rels`` were written without the copies ``missed``."""
        ...


@dataclass(frozen=True)
class ReplicaWrite:
    """The replica registry's rules for one file written to every copy of ``handler``
    (``upload_copies.CopyRules``)."""

    handler: ReplicatedStorage
    rel: str
    fresh: frozenset[str]  # the copies fresh when the write began

    def can_lose(self, copy: Staged, error: Exception) -> bool:
        """A copy that failed a chunk is out of this write if it is gone, its disk is
        full, or it is not fresh (a copy being re-made, whose directory repair may
        replace); any other answer of a fresh copy is the write's."""
        return is_lost(error) or full(error) or copy.node not in self.fresh

    def commit(self, copies: list[Staged], commit: Callable[[Staged, str], None]) -> None:
        """Commit on every copy still staged, within the registry's ``begin``/``end``
        (one commit of a path at a time, so the copies take a path's versions in the
        same order; the staging files are named to the registry, which removes them if
        this process dies mid-commit). A copy lost on the way (or whose disk filled
        up) is stale from then on, and the file is stored if one fresh copy took it;
        a copy being re-made (syncing) is not part of the answer."""
        handler, rel, op = self.handler, self.rel, uuid.uuid4().hex
        staged = {s.node: s for s in copies}
        staging = {node: s.staging for node, s in staged.items()}
        targets, fresh = replica_set.begin(handler.key, [rel], op, staging)
        # Copies staged here whose node the registry has since found gone: this write
        # lacks them too (degraded), though no commit was tried there.
        gone = [node for node in staged if node not in dict(targets)]
        outcomes: dict[str, BaseException | None] = {}
        try:
            for node, _ in targets:
                s = staged.get(node)
                if s is None:
                    outcomes[node] = ConnectionError("not staged: was stale when the write began")
                    continue
                outcomes[node] = s.error or _tried(commit, s, op)
        finally:
            answer, missed = handler.judge(outcomes, fresh)
            replica_set.call(RegistryCalls.end, handler.key, op, missed, [rel])
        for node, s in staged.items():
            if node in gone or outcomes.get(node) is not None:
                abort_copy(s)
        copies.clear()
        if missed or gone:
            handler.degraded([*missed, *gone], [rel])
        if answer is not None:
            raise answer


def _tried(commit: Callable[[Staged, str], None], s: Staged, op: str) -> BaseException | None:
    try:
        commit(s, op)
        return None
    except Exception as e:
        return e
