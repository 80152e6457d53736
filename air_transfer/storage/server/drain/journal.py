"""What a drain confirmed in the durable tier and no manifest names yet: recorded as it
goes (one entry a file, at once), so that a drain killed mid-pass, or the copy that
takes over from it, sends none of it again. An entry leaves once a manifest written
to the tier names the file, or the file is deleted there.

The cluster's GCS keeps it (``cluster._ray`` key-value store), beside the tombstones
and the replica registry's record: it outlives every node but the head, and every
copy of a replicated storage reads the same one. A drain on a new cluster starts
from the tier's manifests alone, and sends again what no manifest names.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable
from typing import Protocol

from air_transfer.cluster._ray_core import kv_delete, kv_items, kv_put
from air_transfer.cluster.nodes import NAMESPACE
from air_transfer.storage.durable.records import FileRecord


class Journal(Protocol):
    def put(self, rel: str, record: FileRecord) -> None: ...

    def remove(self, rels: Iterable[str]) -> None: ...

    def entries(self) -> dict[str, FileRecord]: ...


class MemoryJournal:
    """A journal of one process (tests; a storage used without Ray)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._entries: dict[str, FileRecord] = {}

    def put(self, rel: str, record: FileRecord) -> None:
        with self._lock:
            self._entries[rel] = record

    def remove(self, rels: Iterable[str]) -> None:
        with self._lock:
            for rel in rels:
                self._entries.pop(rel, None)

    def entries(self) -> dict[str, FileRecord]:
        with self._lock:
            return dict(self._entries)


class ClusterJournal:
    """The journal in the GCS, one key a file, under a prefix naming the tier."""

    def __init__(self, uri: str, base: str) -> None:
        storage = hashlib.sha256(f"{uri}\0{base}".encode()).hexdigest()[:24]
        self.prefix = f"durable-journal/{storage}/"

    def put(self, rel: str, record: FileRecord) -> None:
        kv_put(NAMESPACE, self.prefix + rel, json.dumps(record.to_dict()).encode())

    def remove(self, rels: Iterable[str]) -> None:
        for rel in rels:
            kv_delete(NAMESPACE, self.prefix + rel)

    def entries(self) -> dict[str, FileRecord]:
        out = {}
        for key, value in kv_items(NAMESPACE, self.prefix).items():
            rel = key[len(self.prefix) :]
            out[rel] = FileRecord.from_dict(json.loads(value), rel)
        return out
