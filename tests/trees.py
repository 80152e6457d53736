"""Build checkpoint directories for tests and compare two trees exactly."""

from __future__ import annotations

import os
import random
import stat
from pathlib import Path


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
