"""Symlink resolution for merged trees: kernel semantics, linear time (no Ray)."""

from __future__ import annotations

import pytest

from air_transfer.core.links import MAXSYMLINKS, escaping_links
from tests.support.complexity import FrameCount


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
def test_resolution_is_linear(shape: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Links whose resolutions build on each other are each walked once: the walk
    starts one frame per link, whatever the shape (a resolver without memo starts
    2^k frames for link k of the doubling chain, and takes days at this size)."""
    n = 20_000
    if shape == "doubling":
        links = {"l0": "."} | {f"l{k}": f"l{k - 1}/l{k - 1}" for k in range(1, n)}
        expected = 0
    elif shape == "chain":
        links = {f"c{k}": f"c{k + 1}" for k in range(n - 1)} | {f"c{n - 1}": ".."}
        expected = MAXSYMLINKS  # the rest need more links than the kernel follows: ELOOP
    else:  # each link one level deeper, pointing at the previous one
        links = {"/".join(["d"] * k + ["l"]): "../l" for k in range(1, 300)} | {"l": ".."}
        expected = MAXSYMLINKS  # d^k/l follows k + 1 links; deeper ones are ELOOP
    count = FrameCount(monkeypatch)
    assert len(escaping_links(links)) == expected
    assert count.frames > 0
    count.assert_linear(len(links))
