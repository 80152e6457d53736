"""``air-transfer verify ROOT PATH``: read every file of one checkpoint back and check
it, as far as what is stored can prove.

What passing proves:

- every file under PATH reads back whole, now, from node storage (each fresh copy of
  a replicated storage, read on its own), every chunk checked on its way here
  (checksummed where it was read, verified where it arrived);
- the copies agree: the same files, each of the same size and chunk checksums;
- with ``--durable``: the durable tier's copy of each file matches the per-chunk
  checksums the drain recorded when it uploaded it, and, where node storage and the
  tier hold the same version (``storage_state``: durable), equals node storage's;
- a torch DCP checkpoint (one holding ``.metadata``): the metadata reads, and every
  byte range it names lies inside a file of the checkpoint (with torch installed).

- with ``placement="writer"``: every copy holds the same stub of each placed file,
  and every holder its record names holds its bytes as the writer recorded them
  (``cli.verify_placed``).

Node storage keeps no checksum of what the trainer wrote for the files it holds
itself, so such a file whose every copy was altered alike on disk reads back
"whole"; the durable tier's records and the comparison of copies are what catch
changes at rest (a placed file's writer recorded its checksums: they catch them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from air_transfer.cli.output import human_bytes, table
from air_transfer.cli.session import Storage
from air_transfer.cli.trees import (
    CHUNK_BYTES,
    FileSums,
    Tree,
    join,
    read_sums,
    relative_to,
    tree_at,
)
from air_transfer.cli.verify_placed import holder_problems, stub_of
from air_transfer.storage.durable.reads import TierReads, open_verified
from air_transfer.storage.durable.records import FileRecord
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.train import storage_state

Progress = Callable[[int], None]


@dataclass
class FileCheck:
    """What was checked of one file, and what was wrong with it."""

    path: str
    nbytes: int
    copies: int = 0
    durable: str | None = None  # verified | not yet durable | missing
    holders: int | None = None  # placed: the holders whose bytes match its record
    problems: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "bytes": self.nbytes,
            "copies_read": self.copies,
            "good_holders": self.holders,
            "durable": self.durable,
            "problems": self.problems,
            "ok": not self.problems,
        }


@dataclass
class Report:
    """``verify``'s answer for one checkpoint."""

    path: str
    files: list[FileCheck]
    problems: list[str]
    dcp: str | None = None  # checked | not checked: <why>

    @property
    def ok(self) -> bool:
        return not self.problems and all(not f.problems for f in self.files)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "ok": self.ok,
            "bytes": sum(f.nbytes for f in self.files),
            "files": [f.to_dict() for f in self.files],
            "dcp": self.dcp,
            "problems": self.problems,
        }


def total_bytes(storage: Storage, path: str) -> int:
    """What ``verify`` reads from node storage (for a bar): the checkpoint's bytes on
    each copy."""
    return tree_at(storage.filesystem, path).nbytes * max(1, len(storage.copies))


def verify(storage: Storage, path: str, progress: Progress | None = None) -> Report:
    """Check the checkpoint at ``path`` of ``storage`` (see the module)."""
    tree = tree_at(storage.filesystem, path)
    target = DurableTarget.parse(storage.durable) if storage.durable else None
    records = _records(target, storage.root, path, tree) if target else {}
    chunk = next(iter(records.values())).chunk_bytes if records else CHUNK_BYTES
    checks = {rel: FileCheck(join(path, rel), size) for rel, size in tree.files.items()}
    report = Report(path, list(checks.values()), [])
    sums = _read_copies(storage, path, tree, chunk, checks, report, progress)
    if target is not None:
        durable = bool(storage_state(storage.filesystem, path).durable)
        for rel, check in checks.items():
            _check_durable(target, storage.root, check, records.get(rel), sums.get(rel), durable)
    if ".metadata" in tree.files:
        report.dcp = _check_dcp(storage, path, tree, report)
    return report


def _read_copies(
    storage: Storage,
    path: str,
    tree: Tree,
    chunk: int,
    checks: dict[str, FileCheck],
    report: Report,
    progress: Progress | None,
) -> dict[str, FileSums]:
    """Every file read from each copy on its own (one copy: through the storage, which
    reads the durable tier for what node storage lacks); the first copy's sums."""
    copies = storage.copies if len(storage.copies) > 1 else ((storage.node, storage.root),)
    first: dict[str, FileSums] = {}
    stubs: dict[str, bytes] = {}
    for index, (node, root) in enumerate(copies):
        fs = storage.filesystem if len(copies) == 1 else storage.copy_filesystem(node, root)
        where = path if len(copies) == 1 else join(root, relative_to(storage.root, path))
        name = f"the copy on node {node[:12]}"
        try:
            held = tree_at(fs, where).files
        except FileNotFoundError:
            report.problems.append(f"{name} does not hold {path}")
            continue
        for rel in sorted(set(held) - set(tree.files)):
            report.problems.append(f"{name} holds {join(path, rel)}, which the first copy lacks")
        for rel, check in checks.items():
            if rel not in held:
                check.problems.append(f"missing from {name}")
                continue
            stub = stub_of(storage, node, root, join(where, rel), check.nbytes)
            if stub is not None:  # placed: its bytes are checked on its holders
                check.copies += 1
                if stubs.setdefault(rel, stub) != stub:
                    check.problems.append(f"{name}'s stub names other holders than the first's")
                continue
            try:
                got = read_sums(fs, join(where, rel), chunk, progress)
            except (OSError, ValueError) as e:
                check.problems.append(f"unreadable on {name}: {type(e).__name__}: {e}")
                continue
            check.copies += 1
            if got.size != check.nbytes:
                check.problems.append(f"{got.size} bytes on {name}, listed as {check.nbytes}")
            if index == 0 or rel not in first:
                first.setdefault(rel, got)
            elif got != first[rel]:
                check.problems.append(f"{name} differs from the first copy read")
    for rel, stub in stubs.items():
        check = checks[rel]
        good, problems = holder_problems(storage, check.path, check.nbytes, stub)
        check.holders = good
        check.problems += problems
    return first


def _records(target: DurableTarget, root: str, path: str, tree: Tree) -> dict[str, FileRecord]:
    """The tier's record of each file, from its directory's manifest."""
    base, reads = relative_to(root, path), TierReads(target)
    found = {}
    for rel in tree.files:
        record = reads.record(join(base, rel))
        if record is not None:
            found[rel] = record
    return found


def _check_durable(
    target: DurableTarget,
    root: str,
    check: FileCheck,
    record: FileRecord | None,
    sums: FileSums | None,
    durable: bool,
) -> None:
    """The durable tier's copy of one file, checked against the drain's record; and
    the record against node storage's bytes where both hold the same version."""
    if record is None:
        check.durable = "missing" if durable else "not yet durable"
        if durable:
            check.problems.append("the durable tier's manifest does not name it")
        return
    rel = relative_to(root, check.path)
    try:
        with open_verified(target, rel, record) as reader:
            while reader.read(record.chunk_bytes or 1):
                pass
    except (OSError, ValueError) as e:
        check.durable = "failed"
        check.problems.append(f"durable tier: {type(e).__name__}: {e}")
        return
    if sums is not None and (sums.size, sums.sums) != (record.size, record.sums):
        if durable:
            check.durable = "differs"
            check.problems.append("the durable tier's copy differs from node storage's")
        else:
            check.durable = "not yet durable"  # the drain has an older version
        return
    check.durable = "verified"


def _check_dcp(storage: Storage, path: str, tree: Tree, report: Report) -> str:
    """Every byte range a DCP checkpoint's ``.metadata`` names lies inside its file."""
    try:
        from air_transfer.dcp import NodeStorageReader
    except ImportError as e:
        return f"not checked: {e.name or 'torch'} is not installed"
    try:
        metadata = NodeStorageReader(path, filesystem=storage.filesystem).read_metadata()
    except Exception as e:  # torch's unpickling raises what it raises
        report.problems.append(f"{path}/.metadata does not read: {type(e).__name__}: {e}")
        return "failed"
    for index, info in (metadata.storage_data or {}).items():
        size = tree.files.get(info.relative_path)
        if size is None:
            report.problems.append(f"{info.relative_path} (named by .metadata) is missing")
        elif info.offset + info.length > size:
            report.problems.append(
                f"{info.relative_path} holds {size} bytes; .metadata names bytes "
                f"{info.offset}-{info.offset + info.length} of it ({index.fqn})"
            )
    return "checked"


def render(report: Report) -> str:
    """The table ``verify`` prints, the problems that are not one file's, and the
    verdict."""
    rows = [
        [
            check.path,
            human_bytes(check.nbytes),
            check.copies,
            check.durable,
            "ok" if not check.problems else "FAILED: " + "; ".join(check.problems),
        ]
        for check in report.files
    ]
    headers = ["FILE", "SIZE", "COPIES READ", "DURABLE", "RESULT"]
    lines = [table(headers, rows, right=("SIZE", "COPIES READ"))]
    lines += [f"FAILED: {problem}" for problem in report.problems]
    if report.dcp:
        lines.append(f"torch DCP metadata: {report.dcp}")
    total = human_bytes(sum(f.nbytes for f in report.files))
    verdict = "verified" if report.ok else "NOT verified"
    lines.append(f"{report.path}: {verdict} ({len(report.files)} files, {total})")
    return "\n".join(lines)
