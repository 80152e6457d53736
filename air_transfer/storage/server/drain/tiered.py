"""Node storage's metadata operations with a durable tier behind them, in the storage
node's agent, which hosts ``TieredDisk`` as the service of ``NodeMetadata`` and
``NodeDurable``: what node storage does not hold is looked up in the tier's
manifests (less the deletes still pending), deletes are noted as tombstones before
they are done, and every change wakes the drain (the agent's ``changes`` rules,
after each call declared a change: ``touch``).

A storage without a durable tier is ``DiskStorage`` unchanged. One with one is
``attach``-ed (by its callers, explicitly, before they change it or wait for the
tier); the attachment is saved in the GCS without any credential, so an agent that
starts again resumes its drains with what its environment provides, until a caller
attaches the tier again with its own. Deletes of one root hold its lock while they
note and delete, and the drain holds it while it reads the pending deletes: every
tombstone it reads is done in node storage.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import pickle
import posixpath
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.fs as pafs

from air_transfer.cluster._ray_core import kv_items, kv_put
from air_transfer.cluster.nodes import NAMESPACE
from air_transfer.core.confine import oserror
from air_transfer.core.placed_mark import refuse_placed_root
from air_transfer.storage.durable.reads import NOT_FOUND, TierDamaged
from air_transfer.storage.durable.records import FileRecord, child
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.status import DrainStatus
from air_transfer.storage.durable.target import DurableTarget, relative
from air_transfer.storage.durable.tombstones import ClusterTombstones, Tombstones
from air_transfer.storage.node_api import NodeDurable, NodeMetadata, ReplicaOf
from air_transfer.storage.node_wire import Info, Listed
from air_transfer.storage.server.drain.journal import ClusterJournal, Journal
from air_transfer.storage.server.drain.leader import replica_leads
from air_transfer.storage.server.drain.loop import Drainer
from air_transfer.storage.server.drain.passes import Drain
from air_transfer.storage.server.metadata import DiskStorage

logger = logging.getLogger(__name__)
ATTACHMENTS = "durable-attach/"


@dataclass
class Tier:
    """One root's durable tier in this agent; ``resumed``: attached from the saved
    record (no credential of a caller's)."""

    target: DurableTarget
    settings: DrainSettings
    tombstones: Tombstones
    lock: threading.Lock
    drainer: Drainer
    resumed: bool = False


class TieredDisk(NodeMetadata, NodeDurable):
    """``DiskStorage`` plus the durable tier of each root attached to it. ``op``:
    the replicated change a call belongs to, fenced by the agent's ``changes``."""

    def __init__(self, disk: DiskStorage, node_id: str | None = None) -> None:
        self.disk = disk
        self.node_id = node_id
        self._tiers: dict[str, Tier] = {}
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    # -- attachments --------------------------------------------------------------------
    def attach(
        self,
        root: str,
        target: DurableTarget,
        settings: DrainSettings,
        replica: ReplicaOf | None = None,
        tombstones: Tombstones | None = None,
        journal: Journal | None = None,
        resumed: bool = False,
    ) -> str:
        """Drain ``root`` into ``target`` from this agent (idempotent); its epoch.
        ``replica``: ``(storage key, storage node)`` of a replicated storage whose
        copy ``root`` is: it drains only while it leads (``drain_leader``)."""
        if settings.placed_root is None:  # a drain attached before any: it refuses them
            refuse_placed_root(root, "drain it without its replica_root")
        with self._lock:
            tier = self._tiers.get(root)
            if tier is not None:
                if tier.target.uri != target.uri or tier.target.base != target.base:
                    raise ValueError(
                        f"node storage {root!r} already drains into {tier.target.uri}; "
                        f"it cannot also drain into {target.uri}"
                    )
                if tier.resumed and not resumed:  # a caller's credentials, at last
                    tier.target, tier.resumed = target, False
                    tier.drainer.retarget(target)
                return tier.drainer.epoch
            stones = tombstones or ClusterTombstones(target.uri)
            lock = threading.Lock()
            leads = None
            if replica is not None and self.node_id is not None:
                leads = replica_leads(replica[0], self.node_id, replica[1])
            if journal is None and self.node_id is not None:
                journal = ClusterJournal(target.uri, target.base)
            work = Drain(root, target, settings, stones, lock, journal)
            drainer = Drainer(work, leads).start()
            self._tiers[root] = Tier(target, settings, stones, lock, drainer, resumed)
        if not resumed and self.node_id is not None:
            self._save(root, target, settings, replica)
        return drainer.epoch

    def _save(
        self,
        root: str,
        target: DurableTarget,
        settings: DrainSettings,
        replica: ReplicaOf | None,
    ) -> None:
        """Save the attachment for this node's next agent, without any credential."""
        assert self.node_id is not None
        kept = target.persistable()
        if kept is None:
            logger.info(
                "air-transfer: the durable tier %s is not saved for a restarted agent (its "
                "filesystem may hold credentials): its drain resumes when a caller "
                "attaches it again",
                target.uri,
            )
            return
        saved = pickle.dumps((root, kept, settings, replica))
        kv_put(NAMESPACE, _attachment_key(self.node_id, root), saved)

    def resume(self) -> None:
        """Attach every root this node's agent drained before it started again."""
        if self.node_id is None:
            return
        for key, value in kv_items(NAMESPACE, f"{ATTACHMENTS}{self.node_id}/").items():
            try:
                root, target, settings, replica = pickle.loads(value)
                self.attach(root, target, settings, replica, resumed=True)
            except Exception as e:  # another version's record: its next caller attaches
                logger.warning("air-transfer: could not resume the drain %s: %r", key, e)

    def tier(self, root: str) -> Tier | None:
        return self._tiers.get(root)

    def touch(self, root: str) -> None:
        """``root`` changed: its drain (if any) makes a pass soon."""
        tier = self._tiers.get(root)
        if tier is not None:
            tier.drainer.touch()

    def durable_attach(
        self, root: str, target: DurableTarget, settings: DrainSettings, replica: ReplicaOf | None
    ) -> str:
        return self.attach(root, target, settings, replica)

    def durable_request(self, root: str, confirm: bool = False) -> tuple[str, int]:
        drainer = self._require(root).drainer
        return drainer.epoch, drainer.request(confirm)

    def durable_status(
        self, root: str, path: str | None = None, confirm: bool = False
    ) -> DrainStatus:
        rel = None if path is None else relative(root, path)
        return self._require(root).drainer.status(rel, confirm)

    def durable_admit(self, root: str, nbytes: int) -> str | None:
        return self._require(root).drainer.admit(nbytes)

    def durable_release(self, root: str, key: str) -> None:
        self._require(root).drainer.release(key)

    def durable_whole(self, root: str, path: str) -> tuple[bool, str]:
        """Whether the tier holds ``path`` whole (``TierReads.whole``): by its
        manifests, each object there as the drain confirmed it."""
        tier = self._require(root)
        found = tier.drainer.work.reads.whole(relative(root, path))
        return found.whole, found.why

    def stop(self) -> None:
        for tier in list(self._tiers.values()):
            tier.drainer.stop()

    def _require(self, root: str) -> Tier:
        tier = self._tiers.get(root)
        if tier is None:
            raise ValueError(f"node storage {root!r} has no durable tier on this node")
        return tier

    # -- reads: node storage, then the durable tier --------------------------------------
    def fs_info(self, root: str, paths: list[str]) -> list[Info]:
        found = self.disk.fs_info(root, paths)
        tier = self._tiers.get(root)
        missing = [i for i, info in enumerate(found) if info[0] == pafs.FileType.NotFound]
        if tier is None or not missing:
            return found
        deleted = set(tier.tombstones.pending().values())
        reads = tier.drainer.work.reads
        for i in missing:
            try:
                found[i] = reads.info(relative(root, paths[i]), deleted)
            except TierDamaged as e:
                self._damaged(root, posixpath.dirname(paths[i]), e)
                found[i] = NOT_FOUND
        return found

    def _damaged(self, root: str, held: str, damage: TierDamaged) -> None:
        """A damaged part of the tier met while answering for a path in ``held``: if
        node storage holds ``held``, a run goes on (what the tier held there is not
        shown, and that is logged once); else only the tier could answer, and the
        damage is the answer."""
        [info] = self.disk.fs_info(root, [held])
        if info[0] != pafs.FileType.Directory:
            raise damage
        if str(damage) not in self._warned:
            self._warned.add(str(damage))
            logger.warning(
                "air-transfer: %s; node storage's files are answered as they are, "
                "and what the tier held there is not shown",
                damage,
            )

    def durable_locate(self, root: str, path: str) -> tuple[Info, bool, FileRecord | None]:
        """What ``path`` is, whether node storage (not the durable tier) holds it, and
        the tier's record of it where only the tier does."""
        [info] = self.disk.fs_info(root, [path])
        if info[0] != pafs.FileType.NotFound:
            return info, True, None
        [info] = self.fs_info(root, [path])
        tier = self._tiers.get(root)
        if tier is None or info[0] != pafs.FileType.File:
            return info, False, None
        return info, False, tier.drainer.work.reads.record(relative(root, path))

    def fs_list(self, root: str, base: str, recursive: bool, allow_not_found: bool) -> list[Listed]:
        tier = self._tiers.get(root)
        if tier is None:
            return self.disk.fs_list(root, base, recursive, allow_not_found)
        try:
            fast = self.disk.fs_list(root, base, recursive, False)
            here = True
        except FileNotFoundError:
            fast, here = [], False
        deleted = set(tier.tombstones.pending().values())
        try:
            listed = tier.drainer.work.reads.listing(relative(root, base), recursive, deleted)
        except TierDamaged as e:
            self._damaged(root, base, e)
            listed = None
        held = {entry[0] for entry in fast}
        durable = [e for e in listed or [] if e[0] not in held]
        if not here and listed is None:
            [info] = self.fs_info(root, [base])
            if info[0] == pafs.FileType.NotFound and not allow_not_found:
                raise oserror(FileNotFoundError, errno.ENOENT, base)
            if info[0] == pafs.FileType.File:
                raise oserror(NotADirectoryError, errno.ENOTDIR, base)
        return sorted([*fast, *durable])

    # -- changes ------------------------------------------------------------------------
    def fs_create_dir(self, root: str, path: str, recursive: bool, op: str = "") -> None:
        self.disk.fs_create_dir(root, path, recursive)

    def fs_delete_dir(self, root: str, path: str, op: str = "") -> None:
        self._delete(root, path, lambda: self.disk.fs_delete_dir(root, path))

    def fs_delete_file(self, root: str, path: str, op: str = "") -> None:
        self._delete(root, path, lambda: self.disk.fs_delete_file(root, path))

    def fs_delete_dir_contents(
        self, root: str, path: str, missing_dir_ok: bool, op: str = ""
    ) -> None:
        tier = self._tiers.get(root)
        if tier is None:
            self.disk.fs_delete_dir_contents(root, path, missing_dir_ok)
            return
        rel = relative(root, path)
        with tier.lock:  # listed and noted with no other delete between
            children = {e[0].split("/", 1)[0] for e in self.fs_list(root, path, False, True)}
            for name in children:
                tier.tombstones.add(child(rel, name))
            try:
                self.disk.fs_delete_dir_contents(root, path, missing_dir_ok)
            except FileNotFoundError:
                if not children:
                    raise

    def fs_move(self, root: str, src: str, dest: str, op: str = "") -> None:
        tier = self._tiers.get(root)
        if tier is None:
            self.disk.fs_move(root, src, dest)
            return
        with tier.lock:
            key = tier.tombstones.add(relative(root, src))
            try:
                self.disk.fs_move(root, src, dest)
            except FileNotFoundError:
                tier.tombstones.remove(key)
                deleted = set(tier.tombstones.pending().values())
                info = tier.drainer.work.reads.info(relative(root, src), deleted)
                if info[0] != pafs.FileType.NotFound:
                    raise oserror(
                        OSError, errno.ENOTSUP, src,
                        ": held only in the durable tier; copy it instead of moving it",
                    ) from None  # fmt: skip
                raise
            except BaseException:
                tier.tombstones.remove(key)
                raise

    def _delete(self, root: str, path: str, delete: Callable[[], None]) -> None:
        tier = self._tiers.get(root)
        if tier is None:
            delete()
            return
        rel = relative(root, path)
        with tier.lock:
            key = tier.tombstones.add(rel)
            try:
                delete()
            except FileNotFoundError:
                # Held only in the durable tier (a run resumed on a new cluster): the
                # tombstone deletes it there; a path held nowhere is an error.
                others = {k: r for k, r in tier.tombstones.pending().items() if k != key}
                info = tier.drainer.work.reads.info(rel, set(others.values()))
                if info[0] == pafs.FileType.NotFound:
                    tier.tombstones.remove(key)
                    raise
            except BaseException:
                tier.tombstones.remove(key)
                raise


def _attachment_key(node_id: str, root: str) -> str:
    return f"{ATTACHMENTS}{node_id}/{hashlib.sha256(root.encode()).hexdigest()[:24]}"
