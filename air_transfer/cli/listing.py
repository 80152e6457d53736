"""``air-transfer ls ROOT``: the checkpoints under ROOT in node storage, each with
its size, age and where it is kept (``storage_state``: on this many nodes, in the
durable tier or not).

A checkpoint is a directory named ``checkpoint_*`` (Ray Train names each report's
so) or one holding a ``.metadata`` file (a torch DCP checkpoint saved outside Train),
wherever it lies under ROOT; what lies inside one is part of it.
"""

from __future__ import annotations

import posixpath
import time
from dataclasses import dataclass
from typing import Any

import pyarrow.fs as pafs

from air_transfer.cli.output import human_age, human_bytes, table
from air_transfer.cli.session import Storage
from air_transfer.train import storage_state

PREFIX = "checkpoint_"
DCP_METADATA = ".metadata"


@dataclass(frozen=True)
class Found:
    """One checkpoint: its path on the storage node, the directory it lies in (its
    run's, relative to ROOT), its files and bytes, its newest file's mtime, and
    whether it is a torch DCP checkpoint (it holds ``.metadata``)."""

    path: str
    run: str
    files: int
    nbytes: int
    mtime_ns: int
    dcp: bool


def find_checkpoints(fs: pafs.FileSystem, top: str) -> list[Found]:
    """Every checkpoint under ``top`` (see the module), in path order."""
    entries = fs.get_file_info(pafs.FileSelector(top, recursive=True))
    prefix = top.rstrip("/") + "/"
    dirs = {e.path for e in entries if e.type == pafs.FileType.Directory}
    marked = {
        posixpath.dirname(e.path)
        for e in entries
        if e.type == pafs.FileType.File and posixpath.basename(e.path) == DCP_METADATA
    }
    chosen = sorted({d for d in dirs if posixpath.basename(d).startswith(PREFIX)} | marked)
    tops: list[str] = []
    for d in chosen:  # sorted: an enclosing checkpoint comes before what it holds
        if not any(d.startswith(t + "/") for t in tops):
            tops.append(d)
    found = []
    for d in tops:
        inside = [e for e in entries if e.type == pafs.FileType.File and e.path.startswith(d + "/")]
        newest = max((e.mtime_ns or 0 for e in inside), default=0)
        run = posixpath.dirname(d)[len(prefix) :] if d.startswith(prefix) else ""
        found.append(Found(d, run, len(inside), sum(e.size for e in inside), newest, d in marked))
    return found


def list_checkpoints(storage: Storage, top: str) -> list[dict[str, Any]]:
    """Each checkpoint under ``top`` of ``storage`` as a JSON-ready record, with where
    it is kept (``storage_state``)."""
    now = time.time_ns()
    records = []
    for found in find_checkpoints(storage.filesystem, top):
        state = storage_state(storage.filesystem, found.path)
        records.append(
            {
                "path": found.path,
                "run": found.run,
                "files": found.files,
                "bytes": found.nbytes,
                "mtime_ns": found.mtime_ns,
                "age_s": round((now - found.mtime_ns) / 1e9, 3) if found.mtime_ns else None,
                "dcp": found.dcp,
                "copies": state.copies,
                "durable": state.durable,
                "tier": state.tier,
            }
        )
    return records


def state_text(record: dict[str, Any]) -> str:
    """Where a checkpoint is kept, in words: ``local``, ``on 2 copies``, ``durable``
    (and still on node storage), ``durable only`` (a run resumed on a new cluster)."""
    copies = record["copies"]
    if record["durable"]:
        return "durable only" if copies == 0 else "durable"
    if copies > 1:
        return f"on {copies} copies"
    return "local" if record["durable"] is None else "local, not yet durable"


def render(records: list[dict[str, Any]]) -> str:
    """The table ``ls`` prints."""
    rows = [
        [
            r["path"],
            human_bytes(r["bytes"]),
            r["files"],
            human_age(r["age_s"]) if r["age_s"] is not None else None,
            "dcp" if r["dcp"] else "files",
            state_text(r),
        ]
        for r in records
    ]
    headers = ["CHECKPOINT", "SIZE", "FILES", "AGE", "KIND", "STATE"]
    return table(headers, rows, right=("SIZE", "FILES", "AGE"))
