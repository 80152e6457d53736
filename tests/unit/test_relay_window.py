"""A windowed relay's window (``transfer.relay_window``) keeps at most its cap of
chunks, dropping the lowest first, and never a chunk larger than the cap; the
``relayed`` strategy is made of a transfer, never packed."""

from __future__ import annotations

import numpy as np
import pytest

from air_transfer.transfer.fanout import STREAM_SHARE, stream_window
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


def test_the_relayed_strategy_refuses_to_pack() -> None:
    with pytest.raises(TypeError, match="never packed"):
        WindowedRelayStrategy().pack(None)  # type: ignore[arg-type]


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
