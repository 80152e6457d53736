"""Manifest dicts (what ``Manifest.from_dict`` decodes) built entry by entry, for the
tests of the manifest's checks: links, loops, limits, trees of any shape."""

from __future__ import annotations

from air_transfer.core.checks import SCHEMA_VERSION


def entries_dict(entries: list[dict], chunk_bytes: int = 1024, chunks: list | None = None) -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "checksum": "xxh3_128",
        "chunk_bytes": chunk_bytes,
        "entries": entries,
        "chunks": [] if chunks is None else chunks,
    }


def link(path: str, target: str) -> dict:
    return {"path": path, "kind": "symlink", "mode": 0o777, "target": target}


def directory(path: str) -> dict:
    return {"path": path, "kind": "dir", "mode": 0o755}


def empty_file(path: str) -> dict:
    return {"path": path, "kind": "file", "size": 0}


def chain(n: int) -> list[dict]:
    """``l0 -> .``, ``lk -> l(k-1)``: following ``lk`` takes k + 1 links."""
    return [link("l0", ".")] + [link(f"l{k}", f"l{k - 1}") for k in range(1, n)]


def doubling_chain(n: int) -> list[dict]:
    """``l0 -> .``, ``lk -> l(k-1)/l(k-1)``: following ``lk`` takes 2**(k+1) - 1 links."""
    return [link("l0", ".")] + [link(f"l{k}", f"l{k - 1}/l{k - 1}") for k in range(1, n)]
