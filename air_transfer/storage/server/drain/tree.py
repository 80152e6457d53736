"""The drain's picture of the durable tier: every directory's manifest as the tier holds
it (read from there when the drain starts, then kept as it writes them), the
directories whose manifest must be written again, and which paths hold each content
(the sources of copies inside the tier).

A picture, not the truth: nothing here is counted durable, or used as a copy's
source, before the tier confirmed it (``files.confirm``, ``files.copy``); an object
found missing or replaced is marked ``lost`` until it is uploaded again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

from air_transfer.storage.durable.reads import TierReads
from air_transfer.storage.durable.records import DirManifest, FileRecord, child, parent_and_name


class TierTree:
    def __init__(self) -> None:
        self._dirs: dict[str, DirManifest] = {}
        self._tags: dict[str, str] = {}  # the version of each manifest written
        self.dirty: set[str] = set()
        self.lost: set[str] = set()
        self._by_digest: dict[str, set[str]] = {}

    @classmethod
    def load(cls, reads: TierReads) -> TierTree:
        """The tree the tier's manifests describe, from the base down (a directory
        whose manifest is missing is kept as its parent names it)."""
        tree = cls()
        pending = [""]
        while pending:
            rel_dir = pending.pop()
            manifest = reads.manifest(rel_dir)
            if manifest is None:
                continue
            tree._dirs[rel_dir] = manifest
            tree._tags[rel_dir] = "loaded"
            for name, record in manifest.files.items():
                tree._index(child(rel_dir, name), record)
            pending += [child(rel_dir, name) for name in manifest.dirs]
        return tree

    # -- reading -------------------------------------------------------------------------
    def record(self, rel: str) -> FileRecord | None:
        parent, name = parent_and_name(rel)
        manifest = self._dirs.get(parent)
        return None if manifest is None else manifest.files.get(name)

    def manifest(self, rel_dir: str) -> DirManifest | None:
        return self._dirs.get(rel_dir)

    def has_dir(self, rel_dir: str) -> bool:
        return rel_dir in self._dirs

    def files(self) -> Iterator[tuple[str, FileRecord]]:
        for rel_dir, manifest in self._dirs.items():
            for name, record in manifest.files.items():
                yield child(rel_dir, name), record

    def holding(self, digest: str) -> list[str]:
        """Paths whose recorded content is ``digest`` and not known lost."""
        return sorted(p for p in self._by_digest.get(digest, ()) if p not in self.lost)

    def tag(self, rel_dir: str) -> str:
        return self._tags.get(rel_dir, "")

    def dirty_deepest_first(self) -> list[str]:
        """The directories to write, each after every one below it."""
        return sorted(self.dirty, key=lambda d: (-d.count("/") - bool(d), d))

    # -- changing ------------------------------------------------------------------------
    def set_file(self, rel: str, record: FileRecord) -> None:
        """``rel`` holds ``record`` in the tier now (confirmed)."""
        parent, name = parent_and_name(rel)
        self.ensure_dir(parent)
        old = self._dirs[parent].files.get(name)
        if old is not None:
            self._unindex(rel, old)
        files = {**self._dirs[parent].files, name: record}
        self._dirs[parent] = replace(self._dirs[parent], files=files)
        self._index(rel, record)
        self.lost.discard(rel)
        self.dirty.add(parent)

    def ensure_dir(self, rel_dir: str) -> None:
        """``rel_dir`` and every directory above it exist in the picture."""
        if rel_dir in self._dirs:
            return
        self._dirs[rel_dir] = DirManifest(rel_dir)
        self.dirty.add(rel_dir)
        if rel_dir:
            parent, name = parent_and_name(rel_dir)
            self.ensure_dir(parent)
            dirs = self._dirs[parent].dirs | {name}
            self._dirs[parent] = replace(self._dirs[parent], dirs=dirs)
            self.dirty.add(parent)

    def remove(self, rel: str) -> tuple[list[str], list[str]]:
        """Take ``rel`` (a file, or a directory and all below it) out of the picture;
        ``(files, directories)`` it removed."""
        parent, name = parent_and_name(rel)
        manifest = self._dirs.get(parent)
        files: list[str] = []
        dirs: list[str] = []
        if manifest is None:
            return files, dirs
        record = manifest.files.get(name)
        if record is not None:
            self._unindex(rel, record)
            rest = {n: r for n, r in manifest.files.items() if n != name}
            self._dirs[parent] = replace(manifest, files=rest)
            files.append(rel)
        if name in manifest.dirs:
            self._dirs[parent] = replace(self._dirs[parent], dirs=manifest.dirs - {name})
            for below in [d for d in self._dirs if d == rel or d.startswith(rel + "/")]:
                for n, r in self._dirs.pop(below).files.items():
                    self._unindex(child(below, n), r)
                    files.append(child(below, n))
                self._tags.pop(below, None)
                self.dirty.discard(below)
                dirs.append(below)
        if files or dirs:
            self.dirty.add(parent)
        self.lost.difference_update(files)
        return files, dirs

    def to_write(self, rel_dir: str) -> DirManifest:
        """The manifest of ``rel_dir`` to write now: its confirmed files, and those of
        its subdirectories whose own manifest is in the tier (a directory appears
        in its parent once it is whole)."""
        manifest = self._dirs[rel_dir]
        shown = frozenset(n for n in manifest.dirs if child(rel_dir, n) in self._tags)
        return replace(manifest, dirs=shown)

    def dirs(self) -> list[str]:
        return list(self._dirs)

    def written(self, rel_dir: str, tag: str) -> None:
        self._tags[rel_dir] = tag
        self.dirty.discard(rel_dir)

    def _index(self, rel: str, record: FileRecord) -> None:
        self._by_digest.setdefault(record.digest, set()).add(rel)

    def _unindex(self, rel: str, record: FileRecord) -> None:
        held = self._by_digest.get(record.digest)
        if held is not None:
            held.discard(rel)
            if not held:
                del self._by_digest[record.digest]
