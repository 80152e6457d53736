"""The names the library gives what it keeps next to a target: hidden (a leading
dot), made from the target's name and a mark (``internal_name``), digested when the
name is long so that the whole stays within ``NAME_MAX`` (255 bytes). ``is_internal``
tells them from the user's names, for listings to leave out; ``internal_kind`` says
what one is, as ``air-transfer clean`` reports it. Which marks there are and what
each one names: ``core.staging`` (staging, set aside, publish lock) and node
storage (uploads, trash, a replica's marker).
"""

from __future__ import annotations

import hashlib
import os
import re

STAGING = ".air-staging-"
OLD = ".air-old-"
PUBLISH_LOCK = ".air-lock"
LOCK_SUFFIX = ".lock"
#: Marks the staging file of an upload through node storage (``storage.server.uploads``).
UPLOAD_MARK = ".air-upload-"
#: Marks a directory being deleted by node storage (``storage.server.metadata``).
TRASH_MARK = ".air-trash-"
#: Begins the names of the marker in each copy of a replicated node storage, naming
#: the storage and node it is a copy of (``storage.server.replica_marker``).
REPLICA_MARK = ".air-replica"
_MARKS = (STAGING, OLD, PUBLISH_LOCK, UPLOAD_MARK, TRASH_MARK, REPLICA_MARK)
#: A target name longer than this (bytes) is digested in the names made from it: the
#: dot, the longest mark and suffix add at most 46 bytes, and a name may have 255.
_LONG_NAME = 180
SUFFIX = re.compile(r"\d+-[0-9a-f]+")
#: A writer's staging directory or its lock file: (stem, suffix).
STAGED = re.compile(r"(\..*)\.air-staging-(\d+-[0-9a-f]+)(?:\.lock)?", re.DOTALL)
#: The previous target a swap set aside: (stem, suffix).
SET_ASIDE = re.compile(r"(\..*)\.air-old-(\d+-[0-9a-f]+)", re.DOTALL)


def internal_name(name: str, mark: str, suffix: str = "") -> str:
    """The hidden name ``.<name><mark><suffix>`` of something the library makes next
    to ``name`` (``name`` digested if long: see the module)."""
    return f"{stem(name)}{mark}{suffix}"


def is_internal(name: str) -> bool:
    """Whether ``name`` is one that ``internal_name`` makes (listings leave it out)."""
    return name.startswith(".") and any(mark in name for mark in _MARKS)


def internal_kind(name: str) -> str | None:
    """What the hidden name ``name`` is, as ``air-transfer clean`` reports it:
    ``staging`` (a writer's staging directory), ``staging-lock`` (its lock file),
    ``set-aside`` (a target set aside mid-swap), ``publish-lock``, ``upload`` (node
    storage: a file being uploaded), ``trash`` (node storage: a directory being
    deleted); None for a name of the user's."""
    if not is_internal(name):
        return None
    if STAGED.fullmatch(name):
        return "staging-lock" if name.endswith(LOCK_SUFFIX) else "staging"
    if SET_ASIDE.fullmatch(name):
        return "set-aside"
    if name.endswith(PUBLISH_LOCK):
        return "publish-lock"
    if UPLOAD_MARK in name:
        return "upload"
    if TRASH_MARK in name:
        return "trash"
    return None


def stem(name: str) -> str:
    return f".{name if len(os.fsencode(name)) <= _LONG_NAME else _digest(name)}"


def _digest(name: str) -> str:
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:32]
