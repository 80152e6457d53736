"""Complexity guards that count work instead of timing it: how many link targets a
resolution walks (a resolver without memo walks exponentially many on the doubling
chain), so that a guard fails on the algorithm, never on a busy machine."""

from __future__ import annotations

import pytest

from air_transfer.core.links import MAXSYMLINKS, LinkResolver


class FrameCount:
    """Counts the link frames ``LinkResolver`` starts while installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.frames = 0
        link_frame = LinkResolver._link_frame

        def counted(resolver: LinkResolver, node: int) -> object:
            self.frames += 1
            return link_frame(resolver, node)

        monkeypatch.setattr(LinkResolver, "_link_frame", counted)

    def assert_linear(self, links: int) -> None:
        """Each link is walked once when it resolves; one that fails (a loop, more
        than ``MAXSYMLINKS`` links) is walked again by each later link that meets it,
        at most ``MAXSYMLINKS`` frames deep: never more than that per link."""
        assert self.frames <= max(links, 1) * (MAXSYMLINKS + 1), (self.frames, links)
