"""Node storage on K nodes, its copies as one process sees them: ``ReplicaCopies``,
the base of ``replicas.ReplicatedHandler`` that knows which copies the registry
names (registering the storage on first use, each copy's root claimed), attaches
each copy's agent to the durable tier, reads from one fresh copy and fails over to
the next, and applies a change to every copy within the registry's ``begin`` and
``end`` (a fresh copy that missed it is stale before the change returns).
"""

from __future__ import annotations

import logging
import posixpath
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow.fs as pafs
import ray

from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import (
    names_a_node_by_role_or_address,
    resolve_node,
    this_node_id,
)
from air_transfer.config import TransferConfig
from air_transfer.observe import replica_metrics
from air_transfer.storage.client import replica_set
from air_transfer.storage.client.durable_wait import DrainPoint
from air_transfer.storage.client.handler import NodeStorageHandler
from air_transfer.storage.client.replica_set import full, is_lost
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.node_api import NodeCopies, NodeDurable, NodeMetadata
from air_transfer.storage.replica_wire import (
    Copy,
    CopyState,
    RegistryCalls,
    drain_leader,
    on_copy,
    storage_key,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")


def _lost(outcome: BaseException | None) -> bool:
    """A copy that could not take a change the others can: gone, or its disk full."""
    return outcome is not None and (is_lost(outcome, reading=False) or full(outcome))


class ReplicaCopies(NodeStorageHandler):
    """The ``replicas`` copies of the storage under ``root`` of node ``node_id``
    (see ``replicas.ReplicatedHandler``, the one class made of this one)."""

    def __init__(
        self,
        node_id: str | None,
        root: str = "/",
        config: TransferConfig | None = None,
        replicas: int = 2,
        nodes: tuple[str, ...] = (),
        replica_root: str | None = None,
        durable: DurableTarget | None = None,
        drain: DrainSettings | None = None,
        setup: Callable[[], object] | None = None,
    ) -> None:
        super().__init__(node_id, root, config, durable, drain, setup)
        self.replicas, self.nodes = replicas, tuple(nodes)
        self.replica_root = replica_root or self.root
        if not self.replica_root.startswith("/"):
            raise ValueError(f"replica_root must be absolute, got {replica_root!r}")
        replica_set.check_roots(self.root, self.replica_root, replicas)
        self._links: dict[str, AgentLink] = {}
        #: Copies attached to the durable tier: the agent each was attached on.
        self._draining: dict[tuple[str, str], int] = {}

    def __reduce__(self) -> tuple[Any, ...]:
        self._shipped()
        node = self.node_id if ray.is_initialized() else self._node_id
        args = (node, self.root, self.config, self.replicas, self.nodes, self.replica_root)
        return (type(self), (*args, self.durable, self.drain, self.setup))

    def __repr__(self) -> str:
        kind, node = type(self).__name__, self.node_id[:12]
        return f"{kind}(node={node}, root={self.root!r}, K={self.replicas})"

    @property
    def location(self) -> Any:
        """None: a replicated storage is no one node's disk (so the sink and torch
        DCP write it through this handler, to every copy)."""
        return None

    @property
    def key(self) -> str:
        return storage_key(self.node_id, self.root)

    # -- the copies --------------------------------------------------------------------
    def ensure(self) -> tuple[list[Copy], list[str], list[str], int]:
        """The registry's view of this storage, registering it on first use: each
        copy's root is claimed first (``claim_copy``: refused if two copies share a
        directory, or a copy's root, which repair empties, holds files the storage
        did not write; the storage node's own root may hold files, which are kept)."""
        found = replica_set.view(self.key)
        if found is None:
            named = tuple(
                resolve_node(n) if names_a_node_by_role_or_address(n) else n for n in self.nodes
            )
            copies = replica_set.place(
                self.node_id, self.root, self.replicas, named, self.replica_root
            )
            members, taken = [n for n, _ in copies], replica_set.call(RegistryCalls.keys)
            empty = {}
            for i, (node, root) in enumerate(copies):
                link, adopt = self.link_to(node, root), i == 0
                claimed = link.call(
                    NodeCopies.claim_copy, root, self.key, node, members, taken, adopt
                )
                empty[node] = not claimed
            fresh = replica_set.fresh_at_start(copies, empty)
            replica_set.call(
                RegistryCalls.register, self.key, copies, self.replicas, self.replica_root, fresh
            )
            found = replica_set.view(self.key)
            assert found is not None
        if self.durable is not None and self.drain is not None:
            self._attach_copies(found[0])
        return found

    def _attach_durable(self, link: AgentLink) -> None:
        """Nothing here: every copy's agent is attached as the copies are known
        (``_attach_copies``), and the one that leads drains."""

    def _attach_copies(self, copies: list[Copy]) -> None:
        """Attach every copy's agent to the durable tier (once per process and copy):
        each notes the deletes it makes, reads fall through on every copy, and the
        copy that ``drain_leader`` names drains (another takes over when it goes)."""
        durable, drain, replica = self.durable, self.drain, (self.key, self.node_id)
        assert durable is not None and drain is not None  # called only with a tier
        for node, root in copies:
            link = self.link_to(node, root)
            try:
                link.agent()
                if self._draining.get((node, root)) == link.agents_made:
                    continue
                link.call(NodeDurable.durable_attach, root, durable, drain, replica)
            except Exception as e:
                if not is_lost(e):
                    raise
                continue  # a copy that is gone: the registry replaces it
            self._draining[(node, root)] = link.agents_made

    def drain_point(self) -> DrainPoint:
        """The copy whose agent drains this storage now (``drain_leader``)."""
        copies, fresh, _, _ = self.ensure()
        leader = drain_leader(fresh, self.node_id, _ray_core.draining_nodes())
        if leader is None:
            raise ConnectionError(
                f"no fresh copy of node storage {self.root!r} drains it into its durable tier"
            )
        root = dict(copies)[leader]
        return leader, root, self.link_to(leader, root)

    def copies_holding(self, path: str) -> int:
        rel = self.rel(path)
        _, fresh, _, _ = self.ensure()
        if self.durable is None:
            [(ftype, _, _)] = self.read(
                "answer",
                lambda link, root: link.call(NodeMetadata.fs_info, root, [on_copy(root, rel)]),
            )
            return len(fresh) if ftype != pafs.FileType.NotFound else 0
        _, here, _ = self.read(
            "answer",
            lambda link, root: link.call(NodeDurable.durable_locate, root, on_copy(root, rel)),
        )
        return len(fresh) if here else 0

    def settle(self) -> None:
        """``ensure``, by the maker of the filesystem (``storage_filesystem``): a
        storage kept already (in this cluster) keeps its copies, so settings that
        would change them are refused, but more copies are made if asked; a copy
        repair gave up on is tried again (the cause may be fixed)."""
        _, _, _, had = self.ensure()
        template = replica_set.call(RegistryCalls.template, self.key)
        if template != self.replica_root:
            raise ValueError(
                f"node storage {self.root!r} on node {self.node_id[:12]} is kept already with "
                f"replica_root={template!r}; got replica_root={self.replica_root!r} (its "
                "copies stay where they are: pass the same one)"
            )
        if self.replicas < had:
            raise ValueError(
                f"node storage {self.root!r} on node {self.node_id[:12]} is kept already on "
                f"replicas={had} copies in this cluster; replicas={self.replicas} would drop "
                f"copies it relies on: pass replicas={had} or more"
            )
        if self.replicas > had:
            replica_set.call(RegistryCalls.resize, self.key, self.replicas)
            logger.info(
                "air-transfer: node storage %s now keeps %d copies (was %d); repair makes "
                "the new ones",
                self.root,
                self.replicas,
                had,
            )
        replica_set.call(RegistryCalls.retry_failed, self.key)

    def status(self) -> list[CopyState]:
        """Every copy of this storage and its state (``replica_status``)."""
        self.ensure()
        return replica_set.call(RegistryCalls.status, self.key)

    def link_to(self, node: str, root: str) -> AgentLink:
        link = self._links.get(node)
        if link is None or link.root != root:
            link = self._links[node] = AgentLink(node, root, self.config)
        return link

    def rel(self, path: str) -> str:
        """``path`` relative to the storage root ('' for the root)."""
        rel = posixpath.relpath(self._path(path), self.root)
        return "" if rel == "." else rel

    def read(self, what: str, method: Callable[[AgentLink, str], T]) -> T:
        """``method(link, root)`` on the first fresh copy in read order that answers."""
        copies, fresh, _, _ = self.ensure()
        here = this_node_id()
        errors = []
        for node, root in replica_set.read_order(self.key, copies, fresh, here):
            try:
                return method(self.link_to(node, root), root)
            except Exception as e:
                if not is_lost(e):
                    raise
                errors.append(f"{node[:12]}: {type(e).__name__}")
        raise ConnectionError(
            f"no live complete copy of node storage {self.root!r} can {what} "
            f"(tried {', '.join(errors) or 'none: every copy is stale or gone'})"
        )

    def change(self, paths: list[str], method: Callable[[AgentLink, str, str], Any]) -> None:
        """Apply ``method(link, root, op)`` (which submits and returns a ref) to
        every copy, after every change of an overlapping path has ended; the
        storage's answer is its fresh copies' (the storage node's first), a fresh
        copy that answered otherwise or not at all is stale from now on."""
        self.ensure()
        rels = [self.rel(p) for p in paths]
        op = uuid.uuid4().hex
        targets, fresh = replica_set.begin(self.key, rels, op)
        outcomes: dict[str, BaseException | None] = {}
        try:
            refs = {}
            for node, root in targets:
                try:
                    refs[node] = method(self.link_to(node, root), root, op)
                except Exception as e:
                    outcomes[node] = e
            for node, ref in refs.items():
                try:
                    self.link_to(node, dict(targets)[node]).wait(ref)
                    outcomes[node] = None
                except Exception as e:
                    outcomes[node] = e
        finally:
            answer, missed = self.judge(outcomes, fresh)
            replica_set.call(RegistryCalls.end, self.key, op, missed, rels)
        if missed:
            self.degraded(missed, rels)
        if answer is not None:
            raise answer

    def judge(
        self, outcomes: dict[str, BaseException | None], fresh: list[str]
    ) -> tuple[BaseException | None, list[str]]:
        """The storage's answer and the fresh copies that missed it."""
        order = [n for n in dict.fromkeys([self.node_id, *fresh]) if n in fresh and n in outcomes]
        answered = [n for n in order if not _lost(outcomes[n])]
        if not answered:
            filled = [outcomes[n] for n in order if full(outcomes[n])]
            if filled:  # no copy had room: the caller's to know, as on one disk
                return filled[0], []
            lost = [f"{n[:12]}: {outcomes[n]!r}" for n in order]
            return ConnectionError(
                f"no copy of node storage {self.root!r} is reachable ({'; '.join(lost)})"
            ), []
        first = outcomes[answered[0]]
        kind = type(first) if first is not None else None
        missed = [n for n in order if (type(outcomes[n]) if outcomes[n] else None) is not kind]
        return first, missed

    def degraded(self, missed: list[str], rels: list[str]) -> None:
        replica_metrics.degraded_write()
        logger.warning(
            "air-transfer: node storage %s: %s completed without the copies on %s "
            "(unreachable or disagreeing); they are stale until repaired",
            self.root,
            ", ".join(rels) or "the root",
            ", ".join(n[:12] for n in missed),
        )
