"""What the parts of a pass read and change of a drain (``passes.Drain``), declared
once so that ``deletes``, ``confirm`` and ``manifests`` need not import the pass that calls them."""

from __future__ import annotations

import contextlib
import os
import threading
from typing import Protocol

from air_transfer.storage.durable.objects import TierObjects
from air_transfer.storage.durable.reads import TierReads
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.tombstones import Tombstones
from air_transfer.storage.server.drain.journal import Journal
from air_transfer.storage.server.drain.tree import TierTree

Version = tuple[int, int, int, int]


class DrainParts(Protocol):
    root: str
    target: DurableTarget
    settings: DrainSettings
    tombstones: Tombstones
    deletes_lock: threading.Lock
    #: Guards the tree, the versions and the last files (passes' threads, status).
    lock: threading.Lock
    tree: TierTree | None
    objects: TierObjects
    reads: TierReads
    journal: Journal
    #: Files the journal holds (confirmed, not yet named by a manifest written).
    journaled: set[str]
    #: Node storage's version of each file the tier holds (confirmed by this drain).
    versions: dict[str, Version]
    last_files: dict[str, bytes]
    deferred: dict[str, int]
    #: Deletes that wait, and why (the last pass's answer).
    waiting_deletes: dict[str, str]

    def lost(self, rel: str, why: str) -> None: ...


def under(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or below it ("" holds everything)."""
    return not top or path == top or path.startswith(top + "/")


#: The nice of the drain's threads (hashing and sending): absolute (see ``background``).
BACKGROUND_NICE = 10


def background() -> None:
    """This thread at nice ``BACKGROUND_NICE`` (Linux: nice is per thread). Absolute:
    under Ray's worker nice of 15 that is ahead of the agent's other threads, and
    measured faster reports than a nice relative to the agent's (docs/durable.md)."""
    with contextlib.suppress(AttributeError, OSError):  # elsewhere: as it is
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BACKGROUND_NICE)
