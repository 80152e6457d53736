"""Symlink resolution for merged trees: kernel semantics, linear time (no Ray)."""

from __future__ import annotations

import time

import pytest

from air_transfer.core.links import MAXSYMLINKS, escaping_links


@pytest.mark.parametrize(
    ("links", "escaping"),
    [
        ({"s": ".", "l": "s/.."}, ["l"]),  # each fine alone, not together
        ({"current": ".", "l": "current/.."}, ["l"]),
        ({"d/l": "..", "x": "d/l/.."}, ["x"]),  # ".." after a link: its target's parent
        ({"d/l": "..", "x": "d/l/d"}, []),
        ({"a": "b/c/..", "b": "."}, []),
        ({"a": "b/c/../..", "b": "."}, ["a"]),
        ({"up": "../elsewhere"}, ["up"]),
        ({"abs": "/etc"}, ["abs"]),
        ({"to_abs": "abs/x", "abs": "/"}, ["to_abs", "abs"]),
        ({"missing": "nothing/here/../.."}, []),  # lexical where nothing is
        ({"missing": "nothing/../.."}, ["missing"]),
        ({"loop1": "loop2", "loop2": "loop1/x"}, []),  # ELOOP leads nowhere
        ({"sub/model_link": "../model.bin", "sub/dir_link": "deeper"}, []),
    ],
)
def test_escaping_links(links: dict[str, str], escaping: list[str]) -> None:
    assert sorted(escaping_links(links)) == sorted(escaping)


def test_only_the_links_asked_about() -> None:
    assert escaping_links({"s": ".", "l": "s/..", "m": ".."}, ["l"]) == ["l"]


@pytest.mark.parametrize("shape", ["doubling", "chain", "deep"])
def test_resolution_is_linear(shape: str) -> None:
    """100,000 links whose resolutions build on each other: under a few seconds (a
    recursive resolver without memo takes days on the doubling chain)."""
    n = 100_000
    if shape == "doubling":
        links = {"l0": "."} | {f"l{k}": f"l{k - 1}/l{k - 1}" for k in range(1, n)}
        expected = 0
    elif shape == "chain":
        links = {f"c{k}": f"c{k + 1}" for k in range(n - 1)} | {f"c{n - 1}": ".."}
        expected = MAXSYMLINKS  # the rest need more links than the kernel follows: ELOOP
    else:  # each link one level deeper, pointing at the previous one
        links = {"/".join(["d"] * k + ["l"]): "../l" for k in range(1, 300)} | {"l": ".."}
        expected = MAXSYMLINKS  # d^k/l follows k + 1 links; deeper ones are ELOOP
    start = time.perf_counter()
    assert len(escaping_links(links)) == expected
    assert time.perf_counter() - start < 30  # seconds: a complexity guard, not a benchmark
