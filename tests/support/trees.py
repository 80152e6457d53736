"""Build checkpoint directories for tests and compare two trees exactly."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path

from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest


def write_file(path: Path, data: bytes, mode: int | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if mode is not None:
        os.chmod(path, mode)


def rich_tree(root: Path) -> Path:
    """Files, empty files, empty and nested dirs, unicode names, modes, symlinks and
    Ray Train's metadata file."""
    rng = random.Random(7)
    root.mkdir(parents=True, exist_ok=True)
    write_file(root / "model.bin", rng.randbytes(50_000), 0o600)
    write_file(root / "optimizer.pt", rng.randbytes(12_345))
    write_file(root / "run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    write_file(root / "readonly.txt", b"frozen", 0o444)
    write_file(root / "empty.bin", b"")
    write_file(root / "sub" / "deeper" / "leaf.npy", rng.randbytes(4096))
    write_file(root / "sub" / "zero", b"")
    write_file(root / "tokenizer" / "vocab ünï 模型 🚀.json", '{"ü": 1}'.encode())
    (root / "empty_dir").mkdir()
    (root / "sub" / "empty_nested" / "again").mkdir(parents=True)
    write_file(root / ".metadata.json", b'{"epoch": 3, "note": "caf\\u00e9"}')
    os.symlink("../model.bin", root / "sub" / "model_link")
    os.symlink("deeper", root / "sub" / "dir_link")
    os.symlink("missing-but-inside", root / "dangling_inside")
    os.chmod(root / "sub" / "deeper", 0o750)
    return root


def tree_listing(root: Path) -> dict[str, tuple]:
    """path -> (kind, mode, content or link target, mtime_ns) for every entry."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("symlink", None, os.readlink(full), None)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), None, st.st_mtime_ns)
            else:
                out[rel] = ("file", stat.S_IMODE(st.st_mode), full.read_bytes(), st.st_mtime_ns)
        dirnames[:] = [d for d in dirnames if not os.path.islink(Path(dirpath) / d)]
    return out


def assert_same_tree(expected: Path, actual: Path) -> None:
    a, b = tree_listing(expected), tree_listing(actual)
    assert sorted(a) == sorted(b), f"paths differ: {set(a) ^ set(b)}"
    for path in a:
        assert a[path] == b[path], f"{path!r} differs: {a[path][:2]} vs {b[path][:2]}"


#: A symlink in a ``build_manifest`` spec: ``{"l": Link("s/..")}``.
class Link(str):
    pass


def build_manifest(
    spec: dict[str, bytes | Link | None], chunk_bytes: int = 1 << 16, mtime_ns: int = 10**18
) -> tuple[Manifest, list[bytes]]:
    """A manifest and its chunks straight from ``path -> bytes`` (a file), ``Link``
    (a symlink) or ``None`` (a directory); parent directories are added. Faster than
    scanning a tree on disk, and it can describe trees no scan would accept."""
    kinds: dict[str, bytes | Link | None] = {}
    for path, value in spec.items():
        parts = path.split("/")
        for i in range(1, len(parts)):
            kinds.setdefault("/".join(parts[:i]), None)
        kinds[path] = value
    entries, stream = [], []
    for path in sorted(kinds):
        value = kinds[path]
        if value is None:
            entries.append(Entry(path, "dir", mode=0o755, mtime_ns=mtime_ns))
        elif isinstance(value, Link):
            entries.append(Entry(path, "symlink", mtime_ns=mtime_ns, target=str(value)))
        else:
            entries.append(Entry(path, "file", len(value), 0o644, mtime_ns))
            stream.append(value)
    data = b"".join(stream)
    chunks = [data[i : i + chunk_bytes] for i in range(0, len(data), chunk_bytes)]
    return Manifest(tuple(entries), chunk_bytes, tuple(map(chunk_checksum, chunks))), chunks


def file_contents(root: Path) -> dict[str, bytes | str]:
    """relative path -> bytes of every file, link text of every symlink, "" for a
    directory (no recursion: trees may be deep)."""
    out: dict[str, bytes | str] = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        for name in os.listdir(root / rel if rel else root):
            child = f"{rel}/{name}" if rel else name
            full = root / child
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                out[child] = "-> " + os.readlink(full)
            elif stat.S_ISDIR(st.st_mode):
                out[child] = ""
                stack.append(child)
            else:
                out[child] = full.read_bytes()
    return out


def leftovers(parent: Path) -> list[str]:
    """Hidden names air-transfer's writer made next to its targets and left behind."""
    return sorted(n for n in os.listdir(parent) if ".air-" in n)
