"""The manifest's checks at scale: tens of thousands of entries of any shape validate in
near-linear time (counted, not timed: the count is the same proof at any size, and a
quadratic walk is ~N times the linear bound), and deep trees validate without
recursion proportional to their depth."""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable

import pytest

from air_transfer import ManifestError
from air_transfer.extend import Manifest
from tests.support.complexity import FrameCount
from tests.support.manifests import chain, directory, doubling_chain, empty_file, entries_dict, link

N = 25_000


def shape_wide() -> list[dict]:
    return [empty_file(f"f{i}") for i in range(N)]


def shape_deep() -> list[dict]:
    """Directory chains 2,000 levels deep (paths up to 4,000 bytes)."""
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
    """``lk -> l(k-1)`` N long: refused at l40 (ELOOP); the bad link comes last
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
    "chain of N links": (shape_long_chain, "more than 40"),
    "doubling chain of N": (shape_doubling, "more than 40"),
    "wide, last link escapes": (shape_wide_then_escape, "outside"),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_many_entries_of_any_shape_validate_in_linear_time(
    shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The complexity guard, counted rather than timed: every link target is walked
    a bounded number of times (the doubling chain alone used to take days)."""
    make, error = SHAPES[shape]
    d = entries_dict(make())
    count = FrameCount(monkeypatch)
    if error is None:
        assert len(Manifest.from_dict(d).entries) == len(d["entries"])
    else:
        with pytest.raises(ManifestError, match=error):
            Manifest.from_dict(d)
    count.assert_linear(sum(1 for e in d["entries"] if e["kind"] == "symlink"))


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
