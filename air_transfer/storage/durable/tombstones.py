"""Deletes that node storage acknowledged and the durable tier has not applied yet.

A delete (``delete_dir``, ``delete_file``, a ``move``'s source, Train's
``num_to_keep``) is noted here before node storage acknowledges it, so that a reader
falling through to the durable tier never sees what was deleted, and the drain
applies it there later, whichever agent drains by then. The cluster's GCS keeps
them (``cluster._ray`` key-value store): they outlive every node but the head, as
the replica registry's record does. A cluster that ends with deletes pending leaves
those paths in the durable tier: never a loss, at worst an old checkpoint kept.
"""

from __future__ import annotations

import hashlib
import threading
import uuid
from collections.abc import Iterable
from typing import Protocol

from air_transfer.cluster._ray_core import kv_delete, kv_keys, kv_put
from air_transfer.cluster.nodes import NAMESPACE


class Tombstones(Protocol):
    """The pending deletes of one storage: each a key -> the relative path it deletes
    (what the durable tier holds at or under it that node storage does not). A key
    is unique to one delete: applying it never removes a later delete of the same
    path."""

    def add(self, rel: str) -> str: ...

    def remove(self, key: str) -> None: ...

    def pending(self) -> dict[str, str]: ...


def covered(rel: str, deleted: Iterable[str]) -> bool:
    """Whether a delete of one of ``deleted`` (paths) takes ``rel``: it names ``rel``
    or a directory above it."""
    paths = set(deleted)
    if not paths:
        return False
    if "" in paths or rel in paths:
        return True
    parts = rel.split("/")
    return any("/".join(parts[:i]) in paths for i in range(1, len(parts)))


class MemoryTombstones:
    """Tombstones of one process (tests; a storage used without Ray)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._keys: dict[str, str] = {}

    def add(self, rel: str) -> str:
        key = _key(rel)
        with self._lock:
            self._keys[key] = rel
        return key

    def remove(self, key: str) -> None:
        with self._lock:
            self._keys.pop(key, None)

    def pending(self) -> dict[str, str]:
        with self._lock:
            return dict(self._keys)


class ClusterTombstones:
    """Tombstones in the cluster's GCS, one key each, under a prefix naming the
    durable tier (one tier is fed by one storage: every copy of a replicated one
    notes its deletes there), so that every process of the cluster sees the same
    ones and none is lost with the node that noted it."""

    def __init__(self, durable: str) -> None:
        storage = hashlib.sha256(durable.encode()).hexdigest()[:24]
        self.prefix = f"durable-delete/{storage}/"

    def add(self, rel: str) -> str:
        key = _key(rel)
        kv_put(NAMESPACE, self.prefix + key, b"1")
        return key

    def remove(self, key: str) -> None:
        kv_delete(NAMESPACE, self.prefix + key)

    def pending(self) -> dict[str, str]:
        keys = (key[len(self.prefix) :] for key in kv_keys(NAMESPACE, self.prefix))
        return {key: key.split(":", 1)[1] for key in keys if ":" in key}


def _key(rel: str) -> str:
    """``<unique id>:<path>`` (the id holds no colon)."""
    return f"{uuid.uuid4().hex}:{rel}"
