"""One drain pass: node storage's changes applied to the durable tier, each confirmed.

In order (``Drain.run``):

1. On its first pass (a drain that starts, or takes over from another copy): abort
   the multipart uploads a dead drain left, and read the tier's manifests and the
   journal (what was confirmed and no manifest names yet).
2. When asked to (``wait_durable``, the scrub): confirm every object it counts
   durable, and every manifest it wrote; what the tier lost is sent again below.
3. Read the files uploaded last (``DrainSettings.last``: DCP's ``.metadata``, Ray
   Train's run state) as they are now, then scan the rest.
4. Put each file whose version the tier lacks (``Drain.put``, several at a time):
   confirmed where the tier holds its content at that path already; else copied
   inside the tier from a confirmed source; else sent. Each falls back to the next
   when the tier says no; each file confirmed goes into the journal at once. A file
   that fails does not stop the others.
5. If none failed, the files uploaded last, as read in 3.
6. Write (``manifests``) the manifest of every changed directory whose files node storage holds are
   all confirmed, deepest first (a directory appears in its parent's manifest once
   its own is there), then let the journal forget what they name.
7. Apply the pending deletes (``deletes``).

So the tier never names a file it does not hold, never shows run state naming a
checkpoint before the checkpoint, and a reader by the manifests never sees a
directory before its files.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field, replace

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.threads import pool
from air_transfer.observe import durable_metrics
from air_transfer.storage.durable.objects import TierObjects
from air_transfer.storage.durable.reads import TierReads
from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.s3 import PartBudget
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.tombstones import Tombstones
from air_transfer.storage.server.drain import confirm, deletes, files, manifests
from air_transfer.storage.server.drain.journal import Journal, MemoryJournal
from air_transfer.storage.server.drain.placed import PlacedFiles
from air_transfer.storage.server.drain.scan import Seen, read_last, scan_storage
from air_transfer.storage.server.drain.state import background
from air_transfer.storage.server.drain.tree import TierTree

logger = logging.getLogger(__name__)


class PassFailed(OSError):
    """Files of a pass that did not reach the tier (the others did); the first error,
    and its kind (the name of its type)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass
class Progress:
    """What the drain did and where it is stuck (read by ``status``)."""

    uploaded: int = 0
    copied: int = 0
    stuck: dict[str, str] = field(default_factory=dict)
    lost: int = 0
    #: How fast the last pass that sent anything sent it.
    bytes_per_s: float = 0.0


class Drain:
    """The work of the drain of node storage ``root`` into ``target`` (no thread of
    its own: ``loop.Drainer`` runs it). ``journal``: where confirmed files wait for
    their manifest (default: in memory only)."""

    def __init__(
        self,
        root: str,
        target: DurableTarget,
        settings: DrainSettings,
        tombstones: Tombstones,
        deletes_lock: threading.Lock,
        journal: Journal | None = None,
    ) -> None:
        self.root, self.target, self.settings = root, target, settings
        self.tombstones, self.deletes_lock = tombstones, deletes_lock
        self.journal = MemoryJournal() if journal is None else journal
        budget = PartBudget(settings.part_bytes_in_flight, max(4, settings.concurrency * 2))
        self.objects = TierObjects(target, settings.part_bytes, settings.max_parts, budget)
        self.reads = TierReads(target, settings.read_wait_s)
        self.limit = files.RateLimit(settings.bytes_per_s)
        #: Node storage's placed files (a writer-placed storage's), sent by their holders.
        self.placed = PlacedFiles(root, settings.placed_root)
        self.lock = threading.Lock()
        self.tree: TierTree | None = None
        #: Node storage's version of each file the tier holds (confirmed by this drain).
        self.versions: dict[str, tuple[int, int, int, int]] = {}
        self.last_files: dict[str, bytes] = {}
        self.deferred: dict[str, int] = {}
        self.waiting_deletes: dict[str, str] = {}
        #: Files the journal holds (confirmed, not yet named by a manifest written).
        self.journaled: set[str] = set()
        #: Whether a failed pass may have left a multipart upload open.
        self.leftovers = False
        self.progress = Progress()

    # -- a pass --------------------------------------------------------------------------
    def run(self, confirm_all: bool) -> None:
        """One pass (see the module); raises if any file did not reach the tier."""
        start, sent = time.perf_counter(), self.progress.uploaded
        try:
            self._run(confirm_all)
        except BaseException:
            self.leftovers = True  # a part may be left open: aborted next pass
            raise
        finally:
            # A holder that failed mid-send (its node lost) may have left one open too.
            self.leftovers |= self.placed.take_failed_sends()
            moved = self.progress.uploaded - sent
            if moved:
                rate = moved / max(time.perf_counter() - start, 1e-9)
                with self.lock:
                    self.progress.bytes_per_s = rate
                durable_metrics.upload_rate(rate)

    def _run(self, confirm_all: bool) -> None:
        if self.tree is None:
            self._start()
        elif self.leftovers:
            self._abort_leftovers()
        tree = self.tree
        assert tree is not None
        self.placed.clear()
        if confirm_all:
            confirm.confirm_all(self, tree)
        last, big = read_last(self.root, self.settings)
        scanned = scan_storage(self.root)
        todo = [s for r, s in scanned.files.items() if not self.settings.is_last(r)]
        failed = self._put_all(tree, [s for s in todo if not self._current(s)])
        for rel_dir in sorted(scanned.empty_dirs):
            with self.lock:
                made = tree.has_dir(rel_dir)
            if not made:  # there for plain readers of the tier too
                self.target.filesystem.create_dir(self.target.path(rel_dir), recursive=True)
                with self.lock:
                    tree.ensure_dir(rel_dir)
        if not failed:
            for seen, content in last:
                if not self._current(seen):
                    failed |= self._put_bytes(tree, seen, content)
            failed |= self._put_all(tree, [s for s in big if not self._current(s)])
        manifests.write(self, tree, scan_storage(self.root))
        deletes.apply(self)
        if failed:
            path, why = next(iter(failed.items()))
            raise PassFailed(
                f"{len(failed)} file(s) did not reach the tier; {path}: {why}",
                why.split(":", 1)[0],
            )

    def _current(self, seen: Seen) -> bool:
        with self.lock:
            return self.versions.get(seen.rel) == seen.version

    def _abort_leftovers(self) -> None:
        """Abort the multipart uploads nobody completes (a drain killed, a part or a
        connection that failed, an abort the endpoint did not take)."""
        aborted = self.objects.abort_uploads()
        self.leftovers = False
        if aborted:
            logger.info(
                "air-transfer: aborted %d upload(s) to %s that a drain left unfinished",
                aborted, self.target.uri,
            )  # fmt: skip

    def _start(self) -> TierTree:
        """The first pass: the uploads a dead drain left aborted, the tier's picture
        read (its manifests, then the journal's newer entries)."""
        self._abort_leftovers()
        tree = TierTree.load(self.reads)
        entries = self.journal.entries()
        for rel, record in sorted(entries.items()):
            tree.set_file(rel, record)
        self.journaled = set(entries)
        with self.lock:
            self.tree = tree
        return tree

    # -- files ---------------------------------------------------------------------------
    def _put_all(self, tree: TierTree, todo: list[Seen]) -> dict[str, str]:
        """Put every file of ``todo``, ``concurrency`` at a time: every file's
        checksums first, then one file of each content, then the others (copied
        inside the tier from the first where it can: a frozen file in reports made
        faster than the tier takes them is sent once); the ones that failed, and why."""
        if not todo:
            return {}
        failed: dict[str, str] = {}
        with pool("air-transfer-upload", self.settings.concurrency, background) as uploads:
            measured = list(uploads.map(self._measure_one, todo))
            firsts: dict[str, tuple[Seen, FileRecord]] = {}
            rest: list[tuple[Seen, FileRecord]] = []
            for seen, record in zip(todo, measured, strict=True):
                if isinstance(record, str):
                    failed[seen.rel] = record
                elif record is not None:  # None: replaced or deleted since the scan
                    if record.digest in firsts:
                        rest.append((seen, record))
                    else:
                        firsts[record.digest] = (seen, record)
            for batch in (list(firsts.values()), rest):
                outcomes = list(uploads.map(lambda item: self._put_one(tree, *item), batch))
                for (seen, _), why in zip(batch, outcomes, strict=True):
                    if why:
                        failed[seen.rel] = why
        with self.lock:
            for seen in todo:
                self.progress.stuck.pop(seen.rel, None)
            self.progress.stuck.update(failed)
        return failed

    def _measure_one(self, seen: Seen) -> FileRecord | str | None:
        """``seen``'s record (its checksums), None if it is gone or was replaced since
        the scan, or why it could not be read."""
        try:
            if self.placed.holds(seen):
                return self.placed.measure(seen)
            return files.measure(self.root, seen, self.settings.chunk_bytes)
        except FileNotFoundError:
            return None  # deleted since the scan: its tombstone tells the tier
        except Exception as e:
            return f"{type(e).__name__}: {e}"

    def _put_one(self, tree: TierTree, seen: Seen, record: FileRecord) -> str:
        """Put one measured file (see ``put``); '' or why it failed."""
        try:
            self.put(tree, seen, record, None)
        except FileNotFoundError:
            pass  # deleted since the scan: its tombstone tells the tier
        except Exception as e:
            return f"{type(e).__name__}: {e}"
        return ""

    def put(self, tree: TierTree, seen: Seen, record: FileRecord, content: bytes | None) -> None:
        """Have the tier hold ``record`` at ``seen.rel`` (from ``content`` if given,
        else from node storage's file), confirmed, by the first way that works."""
        rel = seen.rel
        with self.lock:
            held = tree.record(rel)
            sources = tree.holding(record.digest)
        done = None
        if held is not None and held.digest == record.digest:
            found = files.confirm(self.objects, rel, held)
            if found is not None:
                done = replace(found, mode=record.mode, mtime_ns=record.mtime_ns)
            else:
                self.lost(rel, "it is not in the tier as confirmed")
        for source in [s for s in sources if s != rel] if done is None else []:
            with self.lock:
                source_record = tree.record(source)
            if source_record is None:
                continue
            done = files.copy(self.objects, source, source_record, rel, record)
            if done is not None:
                self._count(copied=record.size)
                break
            if self.objects.server_side_copies:
                self.lost(source, f"it cannot serve as the copy source of {rel}")
        if done is None:
            if content is not None:
                done = files.send_bytes(self.objects, rel, record, content)
            elif self.placed.measured(rel):  # no second look at the file
                done = self.placed.send(seen, record, self.objects, self.settings)
            else:
                done = files.send(
                    self.root, self.objects, seen, record, self.settings.codec, self.limit
                )
            if done is None:
                return  # replaced since the scan: the next pass takes the new one
            self._count(uploaded=done.stored_size)
        self.journal.put(rel, done)
        with self.lock:
            self.journaled.add(rel)
            tree.set_file(rel, done)
            self.versions[rel] = seen.version

    def _put_bytes(self, tree: TierTree, seen: Seen, content: bytes) -> dict[str, str]:
        chunk = self.settings.chunk_bytes
        sums = tuple(chunk_checksum(content[i : i + chunk]) for i in range(0, len(content), chunk))
        record = FileRecord(len(content), seen.mtime_ns, seen.mode, chunk, sums)
        try:
            self.put(tree, seen, record, content)
        except Exception as e:
            return {seen.rel: f"{type(e).__name__}: {e}"}
        with self.lock:
            self.last_files[seen.rel] = content
        return {}

    def _count(self, uploaded: int = 0, copied: int = 0) -> None:
        with self.lock:
            self.progress.uploaded += uploaded
            self.progress.copied += copied
        durable_metrics.uploaded(uploaded)

    # -- where it stands -----------------------------------------------------------------
    def lag_bytes(self) -> int:
        """Bytes of node storage whose version the tier does not hold now."""
        return confirm.behind(self, None, False)[0]

    def behind(self, rel: str | None, asked: bool) -> tuple[int, tuple[str, ...], bool | None]:
        """See ``confirm.behind``."""
        return confirm.behind(self, rel, asked)

    def follow(self) -> None:
        """Another copy drains: forget the picture (read again when this one leads)."""
        with self.lock:
            self.tree = None
            self.versions.clear()

    def retarget(self, target: DurableTarget) -> None:
        """The same tier through ``target``'s filesystem (a caller's credentials)."""
        self.target = target
        self.objects = TierObjects(
            target, self.settings.part_bytes, self.settings.max_parts, self.objects.budget
        )
        self.reads = TierReads(target, self.settings.read_wait_s)

    def lost(self, rel: str, why: str) -> None:
        """The tier does not hold ``rel`` as the drain confirmed it: no longer counted,
        nor a copy's source, until it is sent again."""
        with self.lock:
            if self.tree is not None:
                self.tree.lost.add(rel)
            self.versions.pop(rel, None)
            self.progress.lost += 1
        logger.warning(
            "air-transfer: the durable tier %s lost %s (%s); it is uploaded again from "
            "node storage where node storage still holds it",
            self.target.uri, self.target.path(rel), why,
        )  # fmt: skip
