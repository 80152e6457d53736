"""``select_packer`` without Ray: which packer a payload's layout gets, for each place
a caller may stand in, by the rules in their order."""

from __future__ import annotations

import pytest

from air_transfer.transfer.packers import Packer, select_packer
from air_transfer.transfer.strategies import ChunkedStrategy, InlineStrategy, StreamedStrategy
from air_transfer.transfer.strategies.base import Layout
from tests.support.strategies_for_tests import BytesChunksStrategy

BUILT_IN = [Layout.CHUNKS, Layout.OBJECT, Layout.STREAMED]


@pytest.mark.parametrize("blocking", [False, True])
@pytest.mark.parametrize("reuse", [False, True])
def test_a_custom_layout_is_packed_by_its_strategy_here(blocking: bool, reuse: bool) -> None:
    packer = select_packer(Layout.CUSTOM, agent_reads=True, blocking=blocking, reuse=reuse)
    assert packer is Packer.HERE


@pytest.mark.parametrize("layout", BUILT_IN)
def test_a_source_the_agent_cannot_read_is_packed_here(layout: Layout) -> None:
    for blocking in (False, True):
        for reuse in (False, True):
            packer = select_packer(layout, agent_reads=False, blocking=blocking, reuse=reuse)
            assert packer is Packer.HERE


def test_chunks_reuse_live_ones_before_a_blocking_caller_shares_the_packing() -> None:
    assert select_packer(Layout.CHUNKS, agent_reads=True, blocking=True, reuse=True) is Packer.LIVE
    assert select_packer(Layout.CHUNKS, agent_reads=True, blocking=False, reuse=True) is (
        Packer.LIVE
    )
    assert select_packer(Layout.CHUNKS, agent_reads=True, blocking=True, reuse=False) is (
        Packer.SHARED
    )
    assert select_packer(Layout.CHUNKS, agent_reads=True, blocking=False, reuse=False) is (
        Packer.AGENT
    )


@pytest.mark.parametrize("layout", [Layout.OBJECT, Layout.STREAMED])
def test_one_object_and_streamed_are_the_agents_wherever_the_caller_stands(layout: Layout) -> None:
    for blocking in (False, True):
        for reuse in (False, True):
            packer = select_packer(layout, agent_reads=True, blocking=blocking, reuse=reuse)
            assert packer is Packer.AGENT


def test_each_strategy_says_what_its_payload_is() -> None:
    assert ChunkedStrategy.layout is Layout.CHUNKS
    assert InlineStrategy.layout is Layout.OBJECT
    assert StreamedStrategy.layout is Layout.STREAMED
    assert BytesChunksStrategy.layout is Layout.CUSTOM  # a user's: only its pack knows it
