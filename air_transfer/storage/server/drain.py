"""The drain: node storage's changes applied to the durable tier in the background, by
the storage node's agent, pass after pass.

A pass reads the files uploaded last (``DrainSettings.last``: DCP's ``.metadata``,
Ray Train's run state) first, then scans the rest, uploads every file whose version
the tier lacks, then those last files as they were read, then applies the pending
deletes. So the tier never holds a file that names a checkpoint before the
checkpoint (anything it names was stored before it was written, so before it was
read), and never loses the newest complete checkpoint first: a delete is applied
only after the pass's uploads, and not while a last file uploaded still names it
(Ray Train saves its run state before it deletes, so the next pass applies it).

``wait``-ers get a ticket (``request``); a pass that started after the ticket and
ended without error completes it. A pass that fails (the endpoint down, refusing)
is tried again with backoff; its error is logged once per kind. Every upload is
counted in metrics (``observe.durable_metrics``). Plain Python: unit-tested
without Ray (the tombstones are handed in).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from air_transfer.core.confine import open_regular, storage_path
from air_transfer.core.threads import pool, start_daemon
from air_transfer.observe import durable_metrics
from air_transfer.storage.durable.records import FileRecord, read_index, write_index
from air_transfer.storage.durable.settings import LAST_FILE_MAX_BYTES, DrainSettings
from air_transfer.storage.durable.status import DrainStatus
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.tombstones import Tombstones
from air_transfer.storage.server.drain_deletes import apply_delete
from air_transfer.storage.server.drain_scan import Seen, exists, scan
from air_transfer.storage.server.drain_upload import RateLimit, measure, upload, upload_bytes

logger = logging.getLogger(__name__)
#: Paths named in a timeout or a status (the first ones).
SHOWN = 20
#: Passes a delete may wait for newer files that may be copies of what it deletes.
DEFER_PASSES = 3
#: The nice of the drain's threads (hashing and sending): absolute (see ``_background``).
BACKGROUND_NICE = 10


@dataclass
class _State:
    records: dict[str, FileRecord] = field(default_factory=dict)
    #: The node-storage version of each file the tier holds (this drain's uploads).
    versions: dict[str, tuple[int, int, int, int]] = field(default_factory=dict)
    #: The bytes of the last files uploaded: a delete they still name waits.
    last_files: dict[str, bytes] = field(default_factory=dict)
    dirs_made: set[str] = field(default_factory=set)


class Drainer:
    """Feeds the durable tier ``target`` from node storage ``root`` of this node."""

    def __init__(
        self,
        root: str,
        target: DurableTarget,
        settings: DrainSettings,
        tombstones: Tombstones,
        deletes: threading.Lock,
        leads: Callable[[], bool] | None = None,
    ) -> None:
        self.root, self.target, self.settings = root, target, settings
        self.tombstones = tombstones
        #: Held by a delete while it notes its tombstone and deletes (``tiered_disk``),
        #: and here while the pending deletes are read: every one read is done.
        self.deletes = deletes
        #: Whether this drain leads (a copy of a replicated storage); None: always.
        self.leads = leads
        self.epoch = uuid.uuid4().hex
        self._cond = threading.Condition()
        self._requested = 0
        self._completed = 0
        self._wake = True
        self._stop = False
        self._state = _State()
        self._loaded = False
        self._limit = RateLimit(settings.bytes_per_s)
        self._lag = 0
        self._pending: tuple[str, ...] = ()
        self._uploaded = 0
        self._copied = 0
        self._errors = 0
        self._last_error: str | None = None
        self._passes = 0
        self._logged: set[str] = set()
        #: Deletes kept back while a newer file may be copied from what they delete.
        self._deferred: dict[str, int] = {}
        self._thread: threading.Thread | None = None

    # -- control ------------------------------------------------------------------------
    def start(self) -> Drainer:
        if self._thread is not None:
            raise RuntimeError("a drain is started once")
        self._thread = start_daemon(f"air-transfer-drain {self.root}", self._run)
        return self

    def stop(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is None:
            raise RuntimeError("a drain is stopped after it is started")
        self._thread.join()

    def touch(self) -> None:
        """Node storage changed: a pass soon."""
        with self._cond:
            self._wake = True
            self._cond.notify_all()

    def request(self) -> int:
        """A ticket that the next pass to start, once it ends without error, completes."""
        with self._cond:
            self._requested += 1
            self._wake = True
            self._cond.notify_all()
            return self._requested

    def status(self, rel: str | None = None) -> DrainStatus:
        """Where the drain is. For ``rel`` (a path; "" for the root) it also looks
        at node storage now: ``durable`` says whether every file at or under it is in
        the tier as it is now, and ``pending`` and ``lag_bytes`` count the ones that
        are not (a pass may not have seen them yet)."""
        files = None
        if rel is not None:
            files = [s for r, s in scan(self.root).files.items() if _under(r, rel)]
        deletes = len(self.tombstones.pending())
        with self._cond:
            lag, pending, durable = self._lag, self._pending, None
            if files is not None:
                missing = [s for s in files if self._state.versions.get(s.rel) != s.version]
                durable = not missing
                lag = sum(s.size for s in missing)
                pending = tuple(sorted(s.rel for s in missing))[:SHOWN]
            return DrainStatus(
                self.epoch, self._requested, self._completed, lag, pending,
                self._uploaded, self._copied, self._errors, self._last_error, self._passes,
                deletes, durable,
            )  # fmt: skip

    # -- passes -------------------------------------------------------------------------
    def _run(self) -> None:
        _background()
        failures = 0
        while True:
            with self._cond:
                delay = (
                    self.settings.rescan_s
                    if not failures
                    else min(
                        self.settings.backoff_s[0] * 2 ** (failures - 1), self.settings.backoff_s[1]
                    )
                )
                if failures:  # backoff: a change or a request does not cut it short
                    self._cond.wait_for(lambda: self._stop, timeout=delay)
                elif not self._wake:
                    self._cond.wait_for(lambda: self._stop or self._wake, timeout=delay)
                if self._stop:
                    return
                ticket, self._wake = self._requested, False
            if not self._leading():
                with self._cond:  # another copy drains: look again soon
                    self._cond.wait_for(lambda: self._stop, timeout=self.settings.lead_poll_s)
                    self._wake = True
                continue
            try:
                self._pass()
            except Exception as e:
                failures += 1
                self._failed(e)
                continue
            failures = 0
            with self._cond:
                self._completed = max(self._completed, ticket)
                self._passes += 1
                self._cond.notify_all()

    def _leading(self) -> bool:
        if self.leads is None:
            return True
        try:
            return self.leads()
        except Exception as e:  # the record cannot be read now: not leading, for now
            logger.debug("air-transfer: cannot tell whether %s leads its drain: %r", self.root, e)
            return False

    def _pass(self) -> None:
        last, big = self._read_last()
        scanned = scan(self.root)
        data = [s for rel, s in scanned.files.items() if not self.settings.is_last(rel)]
        todo = [s for s in data if self._state.versions.get(s.rel) != s.version]
        later = [(s, b) for s, b in last if self._state.versions.get(s.rel) != s.version]
        big = [s for s in big if self._state.versions.get(s.rel) != s.version]
        with self._cond:
            self._lag = sum(s.size for s in [*todo, *big]) + sum(len(b) for _, b in later)
            self._pending = tuple(sorted(s.rel for s in todo))[:SHOWN]
        durable_metrics.lag(self._lag)
        if not self._loaded:  # after the lag is known: an endpoint down still counts it
            self._load()
        self._upload_all(todo)
        for d in sorted(scanned.empty_dirs - self._state.dirs_made):
            self.target.filesystem.create_dir(self.target.path(d), recursive=True)
            self._state.dirs_made.add(d)
        for seen, content in later:
            record = upload_bytes(self.target, seen, content, self.settings.chunk_bytes)
            self._done(seen, record, len(content), 0)
            self._state.last_files[seen.rel] = content
        self._upload_all(big)  # last files too large to hold: as they are now
        changed = bool(todo or later or big)
        changed |= self._apply_deletes()
        if changed:
            write_index(self.target, self._state.records)
        with self._cond:
            self._lag, self._pending = 0, ()
        durable_metrics.lag(0)

    def _upload_all(self, todo: list[Seen]) -> None:
        """Upload ``todo``: every file's checksums first, then one file of each
        content, then the others of the same content (copied inside the tier from
        the first: a frozen file in every report is sent once), ``concurrency`` at
        a time, at nice ``BACKGROUND_NICE``."""
        if not todo:
            return
        with pool("air-transfer-upload", self.settings.concurrency, _background) as uploads:
            measured = list(uploads.map(self._measure_one, todo))
            failed = [r for r in measured if isinstance(r, Exception)]
            if failed:
                raise failed[0]
            firsts: dict[str, tuple[Seen, FileRecord]] = {}
            rest: list[tuple[Seen, FileRecord]] = []
            for seen, record in zip(todo, measured, strict=True):
                if not isinstance(record, FileRecord):
                    continue  # replaced or deleted since the scan
                if record.digest in firsts:
                    rest.append((seen, record))
                else:
                    firsts[record.digest] = (seen, record)
            for batch in (list(firsts.values()), rest):
                errors = [e for e in uploads.map(self._upload_one, batch) if e is not None]
                if errors:
                    raise errors[0]

    def _measure_one(self, seen: Seen) -> FileRecord | Exception | None:
        try:
            return measure(self.root, seen, self.settings.chunk_bytes)
        except FileNotFoundError:
            return None  # deleted since the scan: its tombstone tells the tier
        except Exception as e:
            return e

    def _upload_one(self, item: tuple[Seen, FileRecord]) -> Exception | None:
        seen, record = item
        try:
            done = upload(self.root, self.target, seen, record, self._limit, self._holding)
        except FileNotFoundError:
            return None  # deleted since the scan: its tombstone tells the tier
        except Exception as e:
            return e
        if done is not None:
            copied = 0 if done.sent else done.record.size
            self._done(seen, done.record, done.sent, copied)
        return None

    def _holding(self, record: FileRecord) -> str | None:
        """A path of the tier holding ``record``'s bytes (the same path first)."""
        digest = record.digest
        with self._cond:
            candidates = [
                rel
                for rel, r in self._state.records.items()
                if r.size == record.size and r.chunk_bytes == record.chunk_bytes
            ]
        matching = [rel for rel in candidates if self._state.records[rel].digest == digest]
        return matching[0] if matching else None

    def _done(self, seen: Seen, record: FileRecord, sent: int, copied: int) -> None:
        with self._cond:
            self._state.records[seen.rel] = record
            self._state.versions[seen.rel] = seen.version
            self._uploaded += sent
            self._copied += copied
            self._lag = max(0, self._lag - record.size)
        durable_metrics.uploaded(sent)

    def _read_last(self) -> tuple[list[tuple[Seen, bytes]], list[Seen]]:
        """The files uploaded last, read now, before the rest is scanned; and those
        too large to hold (``LAST_FILE_MAX_BYTES``), uploaded last as they are then."""
        out, big = [], []
        for rel, seen in scan(self.root).files.items():
            if not self.settings.is_last(rel):
                continue
            if seen.size > LAST_FILE_MAX_BYTES:
                big.append(seen)
                continue
            try:
                fd, st = open_regular(self.root, storage_path(self.root, rel))
            except (FileNotFoundError, NotADirectoryError):
                continue
            try:
                content = os.pread(fd, st.st_size, 0)
                now = Seen.of(rel, os.fstat(fd))
            finally:
                os.close(fd)
            if len(content) == now.size:
                out.append((now, content))
        return out, big

    def _apply_deletes(self) -> bool:
        with self.deletes:  # every delete noted so far is done in node storage
            pending = self.tombstones.pending()
            present = {key: exists(self.root, rel) for key, rel in pending.items()}
        sizes = self._sizes_behind() if pending else set()
        applied = False
        for key, rel in pending.items():
            if self._named(rel):
                continue  # a last file still names it: after that file changes
            if self._source_of_pending(key, rel, sizes):
                continue  # a file still to upload may be a copy of one under it
            removed = apply_delete(
                self.root, self.target, rel, present[key], list(self._state.records)
            )
            with self._cond:
                for gone in removed:
                    self._state.records.pop(gone, None)
                    self._state.versions.pop(gone, None)
                    self._state.last_files.pop(gone, None)
                self._state.dirs_made = {
                    d for d in self._state.dirs_made if not _under(d, rel) or present[key]
                }
            self.tombstones.remove(key)
            self._deferred.pop(key, None)
            applied = True
        return applied

    def _sizes_behind(self) -> set[int]:
        """The sizes of node storage's files the tier lacks now (written during the
        pass): files with the bytes of one of them may serve as its copy's source."""
        files = scan(self.root).files.values()
        return {s.size for s in files if self._state.versions.get(s.rel) != s.version}

    def _source_of_pending(self, key: str, rel: str, sizes: set[int]) -> bool:
        """Whether to keep ``rel``'s files in the tier one more pass: a file written
        since the pass began, not uploaded yet, has the size of one of them (so it may
        be copied from it inside the tier, rather than sent: reports faster than the
        tier, pruned by ``num_to_keep``), for at most ``DEFER_PASSES`` passes."""
        if not sizes:
            return False
        with self._cond:
            held = {r.size for p, r in self._state.records.items() if _under(p, rel)}
        if not held & sizes:
            return False
        deferred = self._deferred.get(key, 0)
        if deferred >= DEFER_PASSES:
            return False
        self._deferred[key] = deferred + 1
        return True

    def _named(self, rel: str) -> bool:
        name = posixpath.basename(rel).encode()
        return bool(name) and any(
            name in content
            for path, content in self._state.last_files.items()
            if not _under(path, rel)
        )

    def _load(self) -> None:
        """What the tier holds, from its index (a drain that starts again or takes
        over), and the last files' contents, which deletes are checked against."""
        records = read_index(self.target)
        last = {}
        for rel in records:
            if self.settings.is_last(rel):
                try:
                    with self.target.filesystem.open_input_stream(self.target.path(rel)) as f:
                        last[rel] = f.read()
                except FileNotFoundError:
                    continue
        with self._cond:
            self._state.records.update(records)
            self._state.last_files.update(last)
        self._loaded = True

    def _failed(self, e: Exception) -> None:
        kind = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        with self._cond:
            self._errors += 1
            self._last_error = kind
        durable_metrics.upload_error(type(e).__name__)
        if kind not in self._logged:
            self._logged.add(kind)
            logger.warning(
                "air-transfer: the durable tier %s did not take node storage %s's changes "
                "(%s). Reports keep landing in node storage and the drain retries with "
                "backoff; check that the endpoint is up and that the Ray cluster's "
                "processes have its credentials (e.g. AWS_ACCESS_KEY_ID in their "
                "environment). Logged once per kind of error.",
                self.target.uri, self.root, kind,
            )  # fmt: skip


def _background() -> None:
    """This thread at nice ``BACKGROUND_NICE`` (Linux: nice is per thread). Absolute:
    under Ray's worker nice of 15 that is ahead of the agent's other threads, and
    measured faster reports than a nice relative to the agent's (docs/durable.md)."""
    with contextlib.suppress(AttributeError, OSError):  # elsewhere: as it is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)


def _under(path: str, top: str) -> bool:
    return not top or path == top or path.startswith(top + "/")
