"""A delete acknowledged by node storage, applied to the durable tier: what the tier
holds at or under the deleted path goes, files and their records, except what node
storage holds there again (made anew after the delete: the pass uploads it)."""

from __future__ import annotations

import contextlib

import pyarrow.fs as pafs

from air_transfer.storage.durable.records import FILES_DIR, delete_record
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.server.drain_scan import exists


def apply_delete(
    root: str, target: DurableTarget, rel: str, present: bool, recorded: list[str]
) -> list[str]:
    """Apply the delete of ``rel``; ``present``: whether node storage holds ``rel``
    again. Return the recorded paths (of ``recorded``) that went."""
    if not rel:
        raise ValueError("the durable tier's base itself is never deleted")
    fs = target.filesystem
    if not present:
        [info] = fs.get_file_info([target.path(rel)])
        if info.type == pafs.FileType.Directory:
            fs.delete_dir(target.path(rel))
        elif info.type == pafs.FileType.File:
            fs.delete_file(target.path(rel))
        _delete_records(target, rel)
        return [r for r in recorded if r == rel or r.startswith(rel + "/")]
    selector = pafs.FileSelector(target.path(rel), recursive=True, allow_not_found=True)
    try:
        found = fs.get_file_info(selector)
    except NotADirectoryError:
        return []  # a file there again: the pass uploads its new version
    removed = []
    for info in found:
        if info.type != pafs.FileType.File:
            continue
        inner = target.rel(info.path)
        if not exists(root, inner):
            fs.delete_file(info.path)
            delete_record(target, inner)
            removed.append(inner)
    return removed


def _delete_records(target: DurableTarget, rel: str) -> None:
    fs = target.filesystem
    delete_record(target, rel)
    with contextlib.suppress(FileNotFoundError):
        fs.delete_dir(target.path(f"{FILES_DIR}/{rel}"))
