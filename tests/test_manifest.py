"""The manifest decodes only what is safe to reproduce; everything else is a
ManifestError raised before any byte reaches a target."""

from __future__ import annotations

import copy
import pickle

import pytest

from air_transfer import Entry, Manifest, ManifestError
from air_transfer.manifest import SCHEMA_VERSION, chunk_checksum

GOOD_SUM = chunk_checksum(b"x" * 10)


def good_dict() -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "checksum": "xxh3_128",
        "chunk_bytes": 8,
        "entries": [
            {"path": "sub", "kind": "dir", "size": 0, "mode": 0o755, "mtime_ns": 1},
            {"path": "sub/a.bin", "kind": "file", "size": 6, "mode": 0o644, "mtime_ns": 2},
            {"path": "b.bin", "kind": "file", "size": 4, "mode": 0o600, "mtime_ns": 3},
            {"path": "sub/link", "kind": "symlink", "mode": 0o777, "target": "../b.bin"},
        ],
        "chunks": [GOOD_SUM, GOOD_SUM],
    }


def test_round_trip_and_derived_views() -> None:
    m = Manifest.from_dict(good_dict())
    assert Manifest.from_dict(m.to_dict()) == m
    assert m.total_bytes == 10 and m.num_chunks == 2
    assert [f.path for f in m.files()] == ["sub/a.bin", "b.bin"]
    assert m.stream_offset("b.bin") == 6
    assert m.chunk_length(0) == 8 and m.chunk_length(1) == 2
    assert m.entry("/sub/link").target == "../b.bin"
    assert "sub/a.bin" in m and "nope" not in m
    assert {e.path for e in m.children("sub")} == {"sub/a.bin", "sub/link"}
    with pytest.raises(FileNotFoundError, match="nope"):
        m.entry("nope")


def test_pickles_through_validation() -> None:
    m = Manifest.from_dict(good_dict())
    assert pickle.loads(pickle.dumps(m)) == m


def with_entry(**changes) -> dict:
    d = good_dict()
    d["entries"][1].update(changes)
    return d


BAD = {
    "absolute path": (with_entry(path="/etc/passwd"), "absolute"),
    "dot-dot segment": (with_entry(path="sub/../../x"), "'..' segment"),
    "dot segment": (with_entry(path="sub/./a"), "'.' segment"),
    "empty segment": (with_entry(path="sub//a"), "empty"),
    "NUL byte": (with_entry(path="sub/a\x00b"), "NUL"),
    "empty path": (with_entry(path=""), "non-empty"),
    "negative size": (with_entry(size=-1), "size of 'sub/a.bin'"),
    "bool size": (with_entry(size=True), "size"),
    "sizes vs chunk count": (with_entry(size=60), "inconsistent"),
    "unknown kind": (with_entry(kind="fifo"), "unknown kind 'fifo'"),
    "mode with type bits": (with_entry(mode=0o100644), "non-permission bits"),
    "dir with a size": (
        {**good_dict(), "entries": [{"path": "d", "kind": "dir", "size": 3}], "chunks": []},
        "must be 0",
    ),
    "unknown field": (with_entry(owner="root"), "unknown fields"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_entries_are_refused(case: str) -> None:
    d, message = BAD[case]
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(d)


def test_duplicate_paths_are_refused() -> None:
    d = good_dict()
    d["entries"].append(copy.deepcopy(d["entries"][2]))
    d["entries"][-1]["size"] = 0
    with pytest.raises(ManifestError, match=r"lists 'b\.bin' twice"):
        Manifest.from_dict(d)


@pytest.mark.parametrize("version", [0, 2, "1", None])
def test_unknown_schema_version_is_refused(version: object) -> None:
    with pytest.raises(ManifestError, match="schema_version"):
        Manifest.from_dict({**good_dict(), "schema_version": version})


def test_missing_fields_and_wrong_types_are_refused() -> None:
    for key in ("chunk_bytes", "entries", "chunks"):
        d = good_dict()
        del d[key]
        with pytest.raises(ManifestError, match=key):
            Manifest.from_dict(d)
    with pytest.raises(ManifestError, match="mapping"):
        Manifest.from_dict([])  # type: ignore[arg-type]
    with pytest.raises(ManifestError, match="malformed"):
        Manifest.from_dict({**good_dict(), "chunks": ["abc", GOOD_SUM]})
    with pytest.raises(ManifestError, match="checksum algorithm"):
        Manifest.from_dict({**good_dict(), "checksum": "md5"})
    with pytest.raises(ManifestError, match="chunk_bytes"):
        Manifest.from_dict({**good_dict(), "chunk_bytes": 0})


def test_parent_must_be_a_directory_entry() -> None:
    d = good_dict()
    d["entries"][1]["path"] = "ghost/a.bin"
    with pytest.raises(ManifestError, match="parent 'ghost'"):
        Manifest.from_dict(d)
    # Writing "sub/link/x" would write through the symlink.
    d = good_dict()
    d["entries"].append({"path": "sub/link/x", "kind": "dir"})
    with pytest.raises(ManifestError, match="parent 'sub/link'"):
        Manifest.from_dict(d)


@pytest.mark.parametrize(
    ("links", "message"),
    [
        ({"sub/link": "../../etc/passwd"}, "outside"),
        ({"sub/link": "/etc/passwd"}, "absolute"),
        ({"sub/link": ""}, "invalid target"),
        # Lexically inside ("d/l/.." normalises to "d"), really the root's parent.
        ({"sub/up": "..", "esc": "sub/up/.."}, "outside"),
        ({"sub/link": "../loop", "loop": "sub/link"}, "loop"),
    ],
)
def test_symlinks_leaving_the_checkpoint_are_refused(links: dict, message: str) -> None:
    d = good_dict()
    d["entries"] = [e for e in d["entries"] if e["kind"] != "symlink"]
    for path, target in links.items():
        d["entries"].append({"path": path, "kind": "symlink", "mode": 0o777, "target": target})
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(d)


def test_symlinks_inside_are_accepted() -> None:
    d = good_dict()
    d["entries"].append({"path": "sub/self", "kind": "symlink", "target": "."})
    d["entries"].append({"path": "via", "kind": "symlink", "target": "sub/self/a.bin"})
    assert Manifest.from_dict(d).entry("via").kind == "symlink"


def test_entries_are_frozen() -> None:
    e = Entry("a", "file", 1)
    with pytest.raises(AttributeError):
        e.size = 2  # type: ignore[misc]
