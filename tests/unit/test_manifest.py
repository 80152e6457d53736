"""The manifest decodes only what is safe to reproduce; everything else is a
ManifestError raised before any byte reaches a target."""

from __future__ import annotations

import copy
import os
import pickle
from pathlib import Path

import pytest

from air_transfer import ManifestError
from air_transfer.config import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from air_transfer.core.checks import SCHEMA_VERSION
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.writer import write_tree
from air_transfer.extend import Entry, Manifest
from tests.support.manifests import directory, empty_file, entries_dict, link

GOOD_SUM = chunk_checksum(b"x" * 1024)


def good_dict() -> dict:
    return {
        "schema_version": SCHEMA_VERSION,
        "checksum": "xxh3_128",
        "chunk_bytes": 1024,
        "entries": [
            {"path": "sub", "kind": "dir", "size": 0, "mode": 0o755, "mtime_ns": 1},
            {"path": "sub/a.bin", "kind": "file", "size": 1000, "mode": 0o644, "mtime_ns": 2},
            {"path": "b.bin", "kind": "file", "size": 100, "mode": 0o600, "mtime_ns": 3},
            {"path": "sub/link", "kind": "symlink", "mode": 0o777, "target": "../b.bin"},
        ],
        "chunks": [GOOD_SUM, GOOD_SUM],
    }


def test_round_trip_and_derived_views() -> None:
    m = Manifest.from_dict(good_dict())
    assert Manifest.from_dict(m.to_dict()) == m
    assert m.total_bytes == 1100 and m.num_chunks == 2
    assert [f.path for f in m.files()] == ["sub/a.bin", "b.bin"]
    assert m.stream_offset("b.bin") == 1000
    assert m.chunk_length(0) == 1024 and m.chunk_length(1) == 76
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


def test_children_index_lists_direct_children_of_any_directory() -> None:
    m = Manifest.from_dict(good_dict())
    assert [e.path for e in m.children("")] == ["sub", "b.bin"]
    assert [e.path for e in m.children("/sub/")] == ["sub/a.bin", "sub/link"]
    assert list(m.children("b.bin")) == [] and list(m.children("nope")) == []


# -- out-of-order and out-of-range entries are ManifestError at decode,
# -- never a FileNotFoundError/OverflowError/TypeError in the writer --------------------


def with_chunks(**changes: object) -> dict:
    return {**good_dict(), **changes}


OUT_OF_RANGE = {
    "child listed before its parent": (
        entries_dict([empty_file("d/f"), directory("d")]),
        r"'d/f' is listed before its parent 'd'",
    ),
    "mode 2**40 (was OverflowError)": (with_entry(mode=2**40), "non-permission bits"),
    "mode with a file-type bit": (with_entry(mode=0o10000), "non-permission bits"),
    "negative mode": (with_entry(mode=-1), r"mode of 'sub/a\.bin' must be an int in \[0, 4095\]"),
    "bool mode": (with_entry(mode=True), "mode of 'sub/a.bin'"),
    "size beyond off_t": (with_entry(size=2**63), "off_t"),
    "mtime_ns beyond 64 bits": (with_entry(mtime_ns=2**63), "signed 64-bit time"),
    "mtime_ns below 64 bits": (with_entry(mtime_ns=-(2**63) - 1), "signed 64-bit time"),
    "bool mtime_ns": (with_entry(mtime_ns=False), "mtime_ns of 'sub/a.bin'"),
    "str size": (with_entry(size="6"), "size of 'sub/a.bin'"),
    "path not a str": (with_entry(path=b"sub/a.bin"), "non-empty string"),
    "kind not a str": (with_entry(kind=["file"]), "unknown kind"),
    "target not a str": (
        entries_dict([{"path": "l", "kind": "symlink", "target": 3}]),
        "invalid target 3",
    ),
    "schema_version True": ({**good_dict(), "schema_version": True}, "schema_version"),
    "chunk_bytes below MIN_CHUNK_BYTES": (
        with_chunks(chunk_bytes=MIN_CHUNK_BYTES - 1),
        r"manifest chunk_bytes must be an int in \[1024, 2147483648\]",
    ),
    "chunk_bytes above MAX_CHUNK_BYTES": (
        with_chunks(chunk_bytes=MAX_CHUNK_BYTES + 1),
        "MIN_CHUNK_BYTES..MAX_CHUNK_BYTES",
    ),
    "uppercase checksum": (with_chunks(chunks=[GOOD_SUM.upper(), GOOD_SUM]), "lowercase hex"),
    "non-hex checksum": (with_chunks(chunks=["z" * 32, GOOD_SUM]), "chunk 0 is malformed"),
    "checksum with a newline": (with_chunks(chunks=[GOOD_SUM, GOOD_SUM + "\n"]), "chunk 1"),
    "segment over NAME_MAX bytes": (with_entry(path="sub/" + "é" * 128), "256 bytes.*NAME_MAX"),
    "path over PATH_MAX bytes": (
        entries_dict(
            [directory("a/" * k + "a") for k in range(2047)] + [empty_file("a/" * 2047 + "bc")]
        ),
        "4096 bytes long.*PATH_MAX",
    ),
    "target over PATH_MAX bytes": (
        entries_dict([link("l", "a/" * 2048)]),
        "target of 4096 bytes.*PATH_MAX",
    ),
    "lone surrogate in a path": (with_entry(path="sub/\ud800"), "cannot be encoded"),
    "lone surrogate in a target": (
        entries_dict([link("l", "\udc41")]),
        "cannot be encoded",
    ),
    # Would name the same file as "é" (b"\xc3\xa9"): two entries, one file on disk.
    "escaped valid UTF-8 bytes": (with_entry(path="sub/\udcc3\udca9"), "valid UTF-8"),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_out_of_order_and_out_of_range_entries_are_manifest_errors(case: str) -> None:
    """Each is a ManifestError naming the entry and the limit at decode,
    not a later FileNotFoundError, OverflowError, TypeError or ENAMETOOLONG."""
    d, message = OUT_OF_RANGE[case]
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(d)


def test_limits_themselves_are_accepted() -> None:
    """The boundaries of those checks are inclusive of what the writer can apply."""
    m = Manifest.from_dict(
        entries_dict(
            [
                directory("n" * 255),
                {"path": "f", "kind": "file", "mode": 0o7777, "mtime_ns": 2**63 - 1},
                {"path": "old", "kind": "file", "mtime_ns": -(2**63)},  # before 1970
                link("l", "/".join(["x" * 255] * 16)),  # 4095 bytes
                # Bytes that are not UTF-8 come back from os.listdir as U+DC80..U+DCFF
                # escapes; os.fsencode restores them, so such names still travel.
                empty_file("\udcff"),
            ],
        )
    )
    assert pickle.loads(pickle.dumps(m)) == m


def test_every_accepted_name_is_created_by_the_writer(tmp_path: Path) -> None:
    """What decoding accepts at its limits, the writer can create (the point of the limits)."""
    deep = "/".join(["d" * 200] * 15)  # 3014 bytes: room for tmp_path under PATH_MAX
    parts = deep.split("/")
    entries = [directory("/".join(parts[: i + 1])) for i in range(len(parts))]
    entries += [empty_file("n" * 255), empty_file("\udcff"), link("l", "x" * 4095)]
    m = Manifest.from_dict(entries_dict(entries))
    write_tree(m, [], tmp_path / "t")
    assert os.listdir(os.path.join(tmp_path, "t", *parts)) == []
    assert sorted(os.listdir(tmp_path / "t")) == sorted(["d" * 200, "n" * 255, "\udcff", "l"])
    assert os.readlink(tmp_path / "t" / "l") == "x" * 4095
