"""Link validation in the manifest: linear in the number of links, and in agreement
with the kernel (its 40-link limit, ELOOP, where a link lands) on random trees."""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_transfer import ManifestError
from air_transfer.core.links import LinkResolver, TreeEntry, check_links
from air_transfer.extend import Manifest
from tests.support.manifests import chain, directory, doubling_chain, empty_file, entries_dict, link


def test_doubling_link_chain_is_refused_at_once_not_in_exponential_time() -> None:
    """22 entries took 3-6 s and 41 would take days, because each link
    was re-expanded at every use. The kernel follows at most 40 links per lookup, so
    ``l5`` (63 links) can never be followed: ELOOP, refused as a loop, in microseconds
    whatever the length of the chain."""
    with pytest.raises(ManifestError, match=r"symlink 'l5' -> 'l4/l4' needs more than 40"):
        Manifest.from_dict(entries_dict(doubling_chain(41)))
    # l0..l4 (at most 31 links followed) are what the kernel resolves: accepted.
    assert Manifest.from_dict(entries_dict(doubling_chain(5))).entry("l4").target == "l3/l3"


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
    """A merge: ``s -> .`` and ``l -> s/..`` are each valid alone; the
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
