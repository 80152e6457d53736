"""A windowed relay's window (``transfer.relay_window``) keeps at most its cap of
chunks, dropping the lowest first, and never a chunk larger than the cap; the
``relayed`` strategy is made of a transfer, never packed."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from air_transfer.config import TransferConfig
from air_transfer.transfer.fanout import RELAY_SHARE, STREAM_SHARE, feed_bounds, stream_window
from air_transfer.transfer.relay_stream import Bounds, StreamRelayStrategy, _Feed
from air_transfer.transfer.relay_window import WindowedRelayStrategy, _Window

MiB = 1024 * 1024


def _chunk(nbytes: int) -> np.ndarray:
    return np.zeros(nbytes, dtype=np.uint8)


def test_the_window_drops_its_lowest_chunks_to_stay_within_its_cap() -> None:
    window = _Window(cap_bytes=30)
    kept = [window.keep(index, _chunk(10)) for index in range(5)]
    assert kept == [10, 20, 30, 30, 30]
    assert sorted(window.kept) == [2, 3, 4]
    assert window.keep(0, _chunk(10)) == 30  # a late stream's pull: kept, then dropped
    assert sorted(window.kept) == [2, 3, 4]


def test_a_chunk_larger_than_the_cap_is_not_kept_and_a_kept_one_not_twice() -> None:
    window = _Window(cap_bytes=30)
    assert window.keep(0, _chunk(31)) == 0
    assert window.keep(1, _chunk(10)) == 10
    assert window.keep(1, _chunk(10)) == 10
    assert list(window.kept) == [1]


@pytest.mark.parametrize("strategy", [WindowedRelayStrategy(), StreamRelayStrategy()])
def test_the_relayed_strategies_refuse_to_pack(strategy: object) -> None:
    with pytest.raises(TypeError, match="never packed"):
        strategy.pack(None)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("store", "chunk", "asked", "ahead"),
    [
        (600 * MiB, 32 * MiB, 4, 1),  # 2 x 32 MiB is already over a tenth: one
        (128 * MiB, MiB, 3, 3),  # room for more than asked: as asked
        (1024 * MiB, 8 * MiB, 16, 6),  # 2 x 6 x 8 MiB <= 102.4 MiB < 2 x 7 x 8 MiB
    ],
)
def test_a_relayed_readers_window_keeps_its_stream_within_its_share_of_the_store(
    store: int, chunk: int, asked: int, ahead: int
) -> None:
    assert stream_window(store, chunk, asked) == ahead
    assert ahead == 1 or 2 * ahead * chunk <= store * STREAM_SHARE


def _feed(cap_chunks: int, readers: dict[int, int]) -> _Feed:
    feed = _Feed((c for c in ()), Bounds(cap_chunks, 4, 60.0), threading.Condition())
    feed.next_index.update(readers)
    return feed


def test_a_feed_keeps_its_last_cap_chunks_and_waits_for_its_slowest_reader() -> None:
    """The chunks kept are the last ``cap_chunks`` fed, so every reader's next is
    among them while the feed stays within ``cap_chunks`` of the slowest."""
    feed = _feed(3, {1: 0, 2: 0})
    for _ in range(3):
        assert not feed.full()
        feed.add(_chunk(1))
    assert sorted(feed.kept) == [0, 1, 2] and feed.full()  # the slowest is at 0
    feed.next_index[1] = feed.next_index[2] = 1
    feed.add(_chunk(1))
    assert sorted(feed.kept) == [1, 2, 3] and feed.full()
    assert feed.lowest() == 1


@pytest.mark.parametrize(
    ("store", "chunk", "window", "bounds"),
    [
        (600 * MiB, 32 * MiB, 4, (1, 2, 3)),  # (300 - 3 x 32) // 64 MiB
        (128 * MiB, MiB, 3, (3, 19, 7)),  # (64 - 22) // 6 MiB
        (64 * MiB, 32 * MiB, 4, (1, 1, 1)),  # nothing fits: one of each at least
    ],
)
def test_a_feed_keeps_its_chunks_and_streams_within_its_share_of_the_store(
    store: int, chunk: int, window: int, bounds: tuple[int, int, int]
) -> None:
    ahead, cap_chunks, streams = feed_bounds(store, chunk, TransferConfig(window=window))
    assert (ahead, cap_chunks, streams) == bounds
    if streams > 1:
        assert (cap_chunks + ahead + 2 * ahead * streams) * chunk <= store * RELAY_SHARE


def test_a_reader_joining_while_a_chunk_is_fed_joins_at_one_that_stays_kept() -> None:
    """Defect: a reader that joined while another fed the next chunk joined at the
    lowest chunk kept, which that chunk then pushed out; it waited for it until it
    was dropped as stuck (60 s), then read the whole transfer again."""
    feed = _feed(2, {1: 5})
    for _ in range(6):
        feed.add(_chunk(1))
    assert sorted(feed.kept) == [4, 5] and feed.joinable() == 4
    feed.feeding = True  # reader 1 feeds chunk 6: it pushes chunk 4 out
    assert feed.joinable() == 5
    feed.next_index[2] = feed.joinable()
    feed.add(_chunk(1))
    assert feed.next_index[2] in feed.kept


def test_a_reader_joining_a_feed_that_has_dropped_nothing_joins_at_its_start() -> None:
    feed = _feed(3, {1: 1})
    feed.add(_chunk(1))
    feed.feeding = True
    assert feed.joinable() == 0
