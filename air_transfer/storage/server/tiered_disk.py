"""Node storage's metadata operations with a durable tier behind them, in the storage
node's agent: what node storage does not hold is looked up in the durable tier (less
the deletes still pending), deletes are noted as tombstones before they are done,
and every change wakes the drain.

A storage without a durable tier is ``DiskStorage`` unchanged. One with one is
``attach``-ed (the caller's handler does it on first use; the attachment is saved
in the GCS, so an agent that starts again resumes its drains). Deletes of one root
hold its lock while they note and delete, and the drain holds it while it reads
the pending deletes: every tombstone it reads is done in node storage.
"""

from __future__ import annotations

import errno
import hashlib
import logging
import pickle
import threading
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow.fs as pafs

from air_transfer.cluster._ray import kv_items, kv_put
from air_transfer.cluster.agent_client import Info, Listed
from air_transfer.core.confine import oserror
from air_transfer.storage.durable import reads
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.status import DrainStatus
from air_transfer.storage.durable.target import DurableTarget, relative
from air_transfer.storage.durable.tombstones import ClusterTombstones, Tombstones
from air_transfer.storage.server.drain import Drainer
from air_transfer.storage.server.drain_leader import replica_leads
from air_transfer.storage.server.metadata import DiskStorage

NAMESPACE = "air_transfer"
logger = logging.getLogger(__name__)


@dataclass
class Tier:
    """One root's durable tier in this agent."""

    target: DurableTarget
    settings: DrainSettings
    tombstones: Tombstones
    lock: threading.Lock
    drainer: Drainer


class TieredDisk:
    """``DiskStorage`` plus the durable tier of each root attached to it."""

    def __init__(self, disk: DiskStorage, node_id: str | None = None) -> None:
        self.disk = disk
        self.node_id = node_id
        self._tiers: dict[str, Tier] = {}
        self._lock = threading.Lock()

    # -- attachments --------------------------------------------------------------------
    def attach(
        self,
        root: str,
        target: DurableTarget,
        settings: DrainSettings,
        replica: tuple[str, str] | None = None,
        tombstones: Tombstones | None = None,
        save: bool = True,
    ) -> str:
        """Drain ``root`` into ``target`` from this agent (idempotent); its epoch.
        ``replica``: ``(storage key, storage node)`` of a replicated storage whose
        copy ``root`` is: it drains only while it leads (``drain_leader``)."""
        with self._lock:
            tier = self._tiers.get(root)
            if tier is not None:
                if tier.target.uri != target.uri or tier.target.base != target.base:
                    raise ValueError(
                        f"node storage {root!r} already drains into {tier.target.uri}; "
                        f"it cannot also drain into {target.uri}"
                    )
                return tier.drainer.epoch
            stones = tombstones or ClusterTombstones(target.uri)
            lock = threading.Lock()
            leads = None
            if replica is not None and self.node_id is not None:
                leads = replica_leads(replica[0], self.node_id, replica[1])
            drainer = Drainer(root, target, settings, stones, lock, leads).start()
            self._tiers[root] = Tier(target, settings, stones, lock, drainer)
        if save and self.node_id is not None:
            saved = pickle.dumps((root, target, settings, replica))
            kv_put(NAMESPACE, _attachment_key(self.node_id, root), saved)
        return drainer.epoch

    def resume(self) -> None:
        """Attach every root this node's agent drained before it started again."""
        if self.node_id is None:
            return
        for key, value in kv_items(NAMESPACE, f"durable-attach/{self.node_id}/").items():
            try:
                root, target, settings, replica = pickle.loads(value)
                self.attach(root, target, settings, replica, save=False)
            except Exception as e:  # another version's record: its next caller attaches
                logger.warning("air-transfer: could not resume the drain %s: %r", key, e)

    def tier(self, root: str) -> Tier | None:
        return self._tiers.get(root)

    def touch(self, root: str) -> None:
        tier = self._tiers.get(root)
        if tier is not None:
            tier.drainer.touch()

    def request(self, root: str) -> tuple[str, int]:
        tier = self._require(root)
        return tier.drainer.epoch, tier.drainer.request()

    def status(self, root: str, path: str | None) -> DrainStatus:
        tier = self._require(root)
        return tier.drainer.status(None if path is None else relative(root, path))

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
        durable = reads.infos(tier.target, [relative(root, paths[i]) for i in missing], deleted)
        for i, info in zip(missing, durable, strict=True):
            found[i] = info
        return found

    def locate(self, root: str, path: str) -> tuple[Info, bool]:
        """What ``path`` is, and whether node storage (not the durable tier) holds it."""
        [info] = self.disk.fs_info(root, [path])
        if info[0] != pafs.FileType.NotFound:
            return info, True
        return self.fs_info(root, [path])[0], False

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
        rel = relative(root, base)
        held = {entry[0] for entry in fast}
        durable = [
            e for e in reads.listing(tier.target, rel, recursive, deleted) if e[0] not in held
        ]
        if not here and not durable:
            [info] = self.fs_info(root, [base])
            if info[0] == pafs.FileType.NotFound and not allow_not_found:
                raise oserror(FileNotFoundError, errno.ENOENT, base)
        return sorted([*fast, *durable])

    # -- changes ------------------------------------------------------------------------
    def fs_create_dir(self, root: str, path: str, recursive: bool) -> None:
        self.disk.fs_create_dir(root, path, recursive)
        self.touch(root)

    def fs_delete_dir(self, root: str, path: str) -> None:
        self._delete(root, path, lambda: self.disk.fs_delete_dir(root, path))

    def fs_delete_file(self, root: str, path: str) -> None:
        self._delete(root, path, lambda: self.disk.fs_delete_file(root, path))

    def fs_delete_dir_contents(self, root: str, path: str, missing_dir_ok: bool) -> None:
        tier = self._tiers.get(root)
        if tier is None:
            self.disk.fs_delete_dir_contents(root, path, missing_dir_ok)
            return
        rel = relative(root, path)
        with tier.lock:  # listed and noted with no other delete between
            children = {e[0].split("/", 1)[0] for e in self.fs_list(root, path, False, True)}
            for name in children:
                tier.tombstones.add(f"{rel}/{name}" if rel else name)
            try:
                self.disk.fs_delete_dir_contents(root, path, missing_dir_ok)
            except FileNotFoundError:
                if not children:
                    raise
        tier.drainer.touch()

    def fs_move(self, root: str, src: str, dest: str) -> None:
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
                [info] = reads.infos(tier.target, [relative(root, src)], deleted)
                if info[0] != pafs.FileType.NotFound:
                    raise oserror(
                        OSError, errno.ENOTSUP, src,
                        ": held only in the durable tier; copy it instead of moving it",
                    ) from None  # fmt: skip
                raise
            except BaseException:
                tier.tombstones.remove(key)
                raise
        tier.drainer.touch()

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
                [info] = reads.infos(tier.target, [rel], set(others.values()))
                if info[0] == pafs.FileType.NotFound:
                    tier.tombstones.remove(key)
                    raise
            except BaseException:
                tier.tombstones.remove(key)
                raise
        tier.drainer.touch()


def _attachment_key(node_id: str, root: str) -> str:
    return f"durable-attach/{node_id}/{hashlib.sha256(root.encode()).hexdigest()[:24]}"
