"""When the replica registry sweeps orphan placed blobs in the background
(``placed_schedule.SweepSchedule``): at once, then at a change of the live nodes
(never twice within the least gap) and every ``every_s``; never with 0. The
setting that says how often (``AIR_TRANSFER_PLACED_SWEEP_S``) is checked."""

from __future__ import annotations

import pytest

from air_transfer.core import environ
from air_transfer.storage.server.placed_schedule import (
    SWEEP_MIN_GAP_S,
    SWEEP_S,
    SweepSchedule,
    sweep_every_s,
)

A, AB = frozenset({"a"}), frozenset({"a", "b"})


def test_a_sweep_at_start_at_a_change_of_nodes_and_every_interval() -> None:
    s = SweepSchedule(60.0)
    assert s.due(A, 0.0)
    s.ran(A, 0.0)
    assert not s.due(A, 59.0)
    assert s.due(A, 60.0)
    assert not s.due(AB, SWEEP_MIN_GAP_S - 0.1)  # a change, but too soon after the last
    assert s.due(AB, SWEEP_MIN_GAP_S)
    s.ran(AB, SWEEP_MIN_GAP_S)
    assert not s.due(AB, SWEEP_MIN_GAP_S + 59.0)
    assert s.due(A, SWEEP_MIN_GAP_S + 10.0)  # a node gone


def test_no_sweep_when_turned_off() -> None:
    s = SweepSchedule(0.0)
    assert not s.due(A, 0.0)
    assert not s.due(AB, 1e9)


def test_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(environ.PLACED_SWEEP_S, raising=False)
    assert sweep_every_s() == SWEEP_S
    monkeypatch.setenv(environ.PLACED_SWEEP_S, "0.5")
    assert sweep_every_s() == 0.5
    monkeypatch.setenv(environ.PLACED_SWEEP_S, "0")
    assert sweep_every_s() == 0.0
    for bad in ("-1", "soon", "nan", "inf"):
        monkeypatch.setenv(environ.PLACED_SWEEP_S, bad)
        with pytest.raises(ValueError, match=f"AIR_TRANSFER_PLACED_SWEEP_S='{bad}'"):
            sweep_every_s()
