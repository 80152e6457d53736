"""The implementation's knobs are checked when built: a count that is no positive
int, a time or share out of its bounds, is refused naming the knob and its bound."""

from __future__ import annotations

import pytest

from air_transfer.core.knobs import KNOBS, Knobs


def test_the_defaults_are_valid() -> None:
    assert Knobs() == KNOBS


@pytest.mark.parametrize(
    ("knob", "value", "message"),
    [
        ("pack_threads", 0, "knob pack_threads must be a positive int, got 0"),
        ("read_buffer_bytes", 1.5, "knob read_buffer_bytes must be a positive int"),
        ("relay_threads", True, "knob relay_threads must be a positive int, got True"),
        ("pack_ring_buffers", 2, "knob pack_ring_buffers must be >= 3"),
        ("lease_poll_s", 0.0, r"knob lease_poll_s must be in \(0, 60\], got 0.0"),
        ("upload_reap_s", 601.0, r"knob upload_reap_s must be in \(0, 600\], got 601.0"),
        ("lease_break_poll_s", 5.5, r"knob lease_break_poll_s must be in \(0, 5\]"),
        ("read_lease_s", -1.0, "knob read_lease_s must be > 0, got -1.0"),
        ("stream_above_store_fraction", 1.2, r"must be in \(0, 1\], got 1.2"),
        ("progress_delay_s", 3600.0, r"knob progress_delay_s must be in \[0, 3600\)"),
    ],
)
def test_a_knob_out_of_bounds_is_refused_by_name(knob: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Knobs(**{knob: value})  # type: ignore[arg-type]


def test_the_bounds_are_inclusive_where_they_say() -> None:
    bounds = Knobs(lease_poll_s=60.0, stream_above_store_fraction=1.0, progress_delay_s=0.0)
    assert bounds.lease_poll_s == 60.0
