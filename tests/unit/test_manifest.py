"""The manifest decodes only what is safe to reproduce; everything else is a
ManifestError raised before any byte reaches a target."""

from __future__ import annotations

import copy
import errno
import os
import pickle
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_transfer import Entry, Manifest, ManifestError
from air_transfer.config import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES
from air_transfer.core.links import LinkResolver, TreeEntry, check_links
from air_transfer.core.manifest import SCHEMA_VERSION, chunk_checksum
from air_transfer.core.writer import write_tree

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


# -- issue 10 item 5: out-of-order and out-of-range entries are ManifestError at decode,
# -- never a FileNotFoundError/OverflowError/TypeError in the writer --------------------


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
    """Issue 10 item 5: each is a ManifestError naming the entry and the limit at decode,
    not a later FileNotFoundError, OverflowError, TypeError or ENAMETOOLONG."""
    d, message = OUT_OF_RANGE[case]
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(d)


def test_limits_themselves_are_accepted() -> None:
    """The boundaries of item 5 are inclusive of what the writer can apply."""
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
    """What decoding accepts at its limits, the writer can create (item 5's point)."""
    deep = "/".join(["d" * 200] * 15)  # 3014 bytes: room for tmp_path under PATH_MAX
    parts = deep.split("/")
    entries = [directory("/".join(parts[: i + 1])) for i in range(len(parts))]
    entries += [empty_file("n" * 255), empty_file("\udcff"), link("l", "x" * 4095)]
    m = Manifest.from_dict(entries_dict(entries))
    write_tree(m, [], tmp_path / "t")
    assert os.listdir(os.path.join(tmp_path, "t", *parts)) == []
    assert sorted(os.listdir(tmp_path / "t")) == sorted(["d" * 200, "n" * 255, "\udcff", "l"])
    assert os.readlink(tmp_path / "t" / "l") == "x" * 4095


# -- issue 10 item 4: link validation is linear, and agrees with the kernel ---------------


def doubling_chain(n: int) -> list[dict]:
    """``l0 -> .``, ``lk -> l(k-1)/l(k-1)``: following ``lk`` takes 2**(k+1) - 1 links."""
    return [link("l0", ".")] + [link(f"l{k}", f"l{k - 1}/l{k - 1}") for k in range(1, n)]


def test_doubling_link_chain_is_refused_at_once_not_in_exponential_time() -> None:
    """Issue 10 item 4: 22 entries took 3-6 s and 41 would take days, because each link
    was re-expanded at every use. The kernel follows at most 40 links per lookup, so
    ``l5`` (63 links) can never be followed: ELOOP, refused as a loop, in microseconds
    whatever the length of the chain."""
    with pytest.raises(ManifestError, match=r"symlink 'l5' -> 'l4/l4' needs more than 40"):
        Manifest.from_dict(entries_dict(doubling_chain(41)))
    # l0..l4 (at most 31 links followed) are what the kernel resolves: accepted.
    assert Manifest.from_dict(entries_dict(doubling_chain(5))).entry("l4").target == "l3/l3"


def chain(n: int) -> list[dict]:
    return [link("l0", ".")] + [link(f"l{k}", f"l{k - 1}") for k in range(1, n)]


def test_link_chain_follows_the_kernels_40_link_limit(tmp_path: Path) -> None:
    """``l39`` takes 40 links to follow, ``l40`` 41: the kernel resolves the first and
    refuses the second with ELOOP; the manifest does the same."""
    Manifest.from_dict(entries_dict(chain(40)))
    with pytest.raises(ManifestError, match=r"'l40' -> 'l39' needs more than 40 symlinks"):
        Manifest.from_dict(entries_dict(chain(41)))
    for e in chain(41):
        os.symlink(e["target"], tmp_path / e["path"])
    assert os.path.samefile(tmp_path / "l39", tmp_path)
    with pytest.raises(OSError, match="Too many levels of symbolic links"):
        os.stat(tmp_path / "l40")


TO_A_B = [directory("a"), directory("a/b"), link("a/b/t", ".."), link("p", "a/b/t")]


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        # ".." at the root, directly, after a link, after a dangling name.
        ([link("up", "..")], "outside"),
        ([directory("d"), link("d/up", ".."), link("esc", "d/up/..")], "'esc' -> 'd/up/..'"),
        ([link("x", "missing/../..")], "'x' -> 'missing/../..' points outside"),
        ([directory("d"), link("d/x", "f/g/../../../..")], "outside"),
        # A link inside a directory reached through a link resolves from where it lies.
        (
            [directory("d"), link("d/up", ".."), link("via", "d"), link("esc", "via/up/..")],
            "'esc' -> 'via/up/..' points outside",
        ),
        # Links to links to directories, then one ".." too many.
        (
            [*TO_A_B, link("q", "p/../..")],
            "'q' -> 'p/../..' points outside",
        ),
        ([link("a", "b"), link("b", "a")], "loop"),
        ([link("a", "a/..")], "loop"),
        ([directory("d"), link("d/l", "../l2/x"), link("l2", "d/l")], "loop"),
    ],
)
def test_links_leaving_the_checkpoint_or_looping_are_refused(
    entries: list[dict], message: str
) -> None:
    with pytest.raises(ManifestError, match=message):
        Manifest.from_dict(entries_dict(entries))


@pytest.mark.parametrize(
    ("entries", "link_path", "lands_at"),
    [
        ([link("dangling", "missing-but-inside")], "dangling", "missing-but-inside"),
        ([link("x", "missing/..")], "x", ""),
        ([directory("d"), link("d/x", "missing/../../f")], "d/x", "f"),
        ([directory("a"), link("a/up", ".."), link("p", "a/up/a/up/a")], "p", "a"),
        (
            [*TO_A_B, link("q", "p/..")],
            "q",
            "",
        ),
        ([directory("d"), link("d/self", "."), link("s", "d/self/self/self")], "s", "d"),
        ([empty_file("f"), link("g", "f/..")], "g", ""),  # ENOTDIR on disk: harmless
    ],
)
def test_links_that_stay_inside_are_accepted(
    entries: list[dict], link_path: str, lands_at: str
) -> None:
    Manifest.from_dict(entries_dict(entries))
    tree = {e["path"]: (e["kind"], e.get("target")) for e in entries}
    assert LinkResolver(tree).link_target(link_path) == lands_at


def test_resolver_works_on_a_merged_tree() -> None:
    """Issue 10 item 3's merge: ``s -> .`` and ``l -> s/..`` are each valid alone; the
    resolver over both (or over a manifest plus what lies on disk) refuses ``l``."""
    check_links({"s": ("symlink", ".")})
    check_links({"l": ("symlink", "s/..")})
    with pytest.raises(ManifestError, match=r"'l' -> 's/\.\.' points outside"):
        check_links({"s": ("symlink", "."), "l": ("symlink", "s/..")})
    resolver = LinkResolver({"d": ("dir", None), "d/c": ("symlink", "."), "x": ("file", None)})
    assert resolver.resolve("d/c/c/../d/c") == "d"
    assert resolver.resolve("c", start="d") == "d"
    assert resolver.resolve("new/file") == "new/file"
    with pytest.raises(ManifestError, match=r"path 'd/c/\.\./\.\.' points outside"):
        resolver.resolve("d/c/../..")
    with pytest.raises(ManifestError, match="not a directory of the tree"):
        LinkResolver({"l": ("symlink", "."), "l/x": ("file", None)})


# Small random trees of directories, files and links, made on disk: where the kernel
# resolves a link, the resolver must land on the same place; where the kernel leaves
# the tree or says ELOOP, the resolver must refuse. (A lookup the kernel fails with
# ENOENT/ENOTDIR is dangling: the resolver may accept or, conservatively, refuse it.)
NAMES = ["a", "b", "x", "y", "z"]
random_trees = st.lists(
    st.tuples(
        st.lists(st.sampled_from(NAMES), min_size=1, max_size=3),  # path
        st.sampled_from(["dir", "dir", "file", "symlink", "symlink", "symlink"]),
        st.lists(st.sampled_from([*NAMES, "..", "..", ".", ""]), min_size=1, max_size=6),
    ),
    max_size=12,
)


def build_tree(spec: list[tuple[list[str], str, list[str]]]) -> dict[str, TreeEntry]:
    tree: dict[str, TreeEntry] = {}
    for parts, kind, target_parts in spec:
        path = "/".join(parts)
        parent = "/".join(parts[:-1])
        if path in tree or (parent and tree.get(parent, ("", None))[0] != "dir"):
            continue
        target = "/".join(target_parts) if kind == "symlink" else None
        tree[path] = (kind, (target or ".") if kind == "symlink" else None)
    return tree


def kernel_lookup(root: str, path: str) -> str | None:
    """Where the kernel resolves ``path`` under ``root``: the real path, or None if a
    component is missing or not a directory; OSError(ELOOP) propagates."""
    try:
        fd = os.open(os.path.join(root, path), os.O_PATH)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)


@settings(max_examples=400, deadline=None)
@given(spec=random_trees)
def test_resolver_agrees_with_the_kernel(spec: list[tuple[list[str], str, list[str]]]) -> None:
    tree = build_tree(spec)
    resolver = LinkResolver(tree)
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(os.path.realpath(tmp), "root")  # no name in NAMES
        os.mkdir(root)
        for path, (kind, target) in tree.items():  # parents come first in tree order
            full = os.path.join(root, path)
            if kind == "dir":
                os.mkdir(full)
            elif kind == "file":
                open(full, "w").close()
            else:
                os.symlink(str(target), full)
        for path, (kind, _) in tree.items():
            if kind != "symlink":
                continue
            try:
                real = kernel_lookup(root, path)
            except OSError as e:
                assert e.errno == errno.ELOOP
                with pytest.raises(ManifestError, match=r"loop|more than 40"):
                    resolver.link_target(path)
                continue
            if real is None:
                continue  # dangling: no claim to check
            if real == root or real.startswith(root + "/"):
                expected = "" if real == root else os.path.relpath(real, root)
                assert resolver.link_target(path) == expected
            else:
                with pytest.raises(ManifestError, match="outside"):
                    resolver.link_target(path)


# -- complexity guard: 100,000 entries of any shape validate in well under 10 s ----------

N = 100_000


def shape_wide() -> list[dict]:
    return [empty_file(f"f{i}") for i in range(N)]


def shape_deep() -> list[dict]:
    """50 directory chains 2,000 levels deep (paths up to 4,000 bytes)."""
    entries = []
    for c in range(N // 2000):
        path = f"c{c}"
        entries.append(directory(path))
        for _ in range(2000 - 1):
            path += "/d"
            entries.append(directory(path))
    return entries


def shape_deep_links() -> list[dict]:
    """Chains 1,300 levels deep with a link every 5 levels up to the chain's top: long
    targets walked from deep down (quadratic for a resolver that re-joins paths). The
    cost is linear in the total length of the targets (here 11 million components)."""
    entries: list[dict] = []
    while len(entries) < N:
        path = f"c{len(entries)}"
        entries.append(directory(path))
        for depth in range(1, 1300):
            path += "/d"
            entries.append(directory(path))
            if depth % 5 == 0:
                entries.append(link(f"{path}/up", "../" * depth + "d"))
    return entries[:N]


def shape_chains() -> list[dict]:
    """Link chains of 39 (as long as the kernel follows), one after another."""
    return [link(f"l{k}", f"l{k - 1}" if k % 39 else ".") for k in range(N)]


def shape_through_links() -> list[dict]:
    """Every link goes through 33 others (the kernel's limit is 40), each resolved
    once, then reused."""
    hub = [directory("d"), link("d/up", ".."), link("y", "d/up/d/up/d")]
    return hub + [link(f"x{k}", "d/up/" * 10 + "y/up/" * 5 + "y") for k in range(N - 3)]


def shape_long_chain() -> list[dict]:
    """``lk -> l(k-1)`` 100,000 long: refused at l40 (ELOOP); the bad link comes last
    here, so the whole chain is resolved first."""
    return [*reversed(chain(N))]


def shape_doubling() -> list[dict]:
    return doubling_chain(N)


def shape_wide_then_escape() -> list[dict]:
    return [*shape_wide()[:-1], link("last", "../outside")]


SHAPES = {
    "wide": (shape_wide, None),
    "deep dirs": (shape_deep, None),
    "deep links": (shape_deep_links, None),
    "link chains of 39": (shape_chains, None),
    "links through links": (shape_through_links, None),
    "chain of 100k links": (shape_long_chain, "more than 40"),
    "doubling chain of 100k": (shape_doubling, "more than 40"),
    "wide, last link escapes": (shape_wide_then_escape, "outside"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_100k_entries_of_any_shape_validate_in_linear_time(shape: str) -> None:
    """Issue 10 item 4's complexity guard: near-linear validation (~1 s per shape here;
    the doubling chain alone used to take days)."""
    make, error = SHAPES[shape]
    d = entries_dict(make())
    start = time.perf_counter()
    if error is None:
        assert len(Manifest.from_dict(d).entries) == len(d["entries"])
    else:
        with pytest.raises(ManifestError, match=error):
            Manifest.from_dict(d)
    elapsed = time.perf_counter() - start
    assert elapsed < 10, f"{shape}: {elapsed:.1f} s to validate {len(d['entries'])} entries"


# -- deep trees: no recursion proportional to depth -----------------------------------


def deep_chain(levels: int) -> list[dict]:
    return [directory("/".join(["d"] * k)) for k in range(1, levels + 1)]


def with_little_stack(call: Callable[[], object]) -> object:
    """Run ``call`` with only 100 frames of stack to spare: any recursion per level of
    a 1,200-level tree raises RecursionError."""
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 100)
    try:
        return call()
    finally:
        sys.setrecursionlimit(old)


def test_deep_tree_validates_without_recursion() -> None:
    """1,200 levels, with links at the bottom back to the root and one level above it;
    2,048 one-letter levels are the deepest a path fits in PATH_MAX. (A 100,000-level
    tree cannot be a manifest: its level-2,049 path already passes PATH_MAX, refused.)"""
    bottom = "/".join(["d"] * 1200)
    entries = [
        *deep_chain(1200),
        link(f"{bottom}/root", "../" * 1200),
        link("via", f"{bottom}/root/" + "/".join(["d"] * 800)),  # down, up, down
    ]
    m = with_little_stack(lambda: Manifest.from_dict(entries_dict(entries)))
    assert isinstance(m, Manifest)
    assert with_little_stack(lambda: pickle.loads(pickle.dumps(m))) == m
    escape = [*deep_chain(1200), link(f"{bottom}/up", "../" * 1201)]
    with pytest.raises(ManifestError, match="points outside"):
        with_little_stack(lambda: Manifest.from_dict(entries_dict(escape)))
    with_little_stack(lambda: Manifest.from_dict(entries_dict(deep_chain(2048))))
    with pytest.raises(ManifestError, match=r"4097 bytes long.*PATH_MAX"):
        Manifest.from_dict(entries_dict(deep_chain(2049)))
