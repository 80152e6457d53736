"""The suite's Ray starts are made again when Ray says a node timed out during
startup (a loaded machine), and only then (``tests.support.shared_ray``; no Ray)."""

from __future__ import annotations

import pytest

from tests.support.shared_ray import START_ATTEMPTS, start_with_retries


def test_a_start_that_timed_out_is_made_again_after_cleaning_up() -> None:
    calls: list[str] = []

    def start() -> str:
        calls.append("start")
        if calls.count("start") < START_ATTEMPTS:
            raise Exception("The current node timed out during startup. This could ...")
        return "up"

    assert start_with_retries(start, lambda: calls.append("stop")) == "up"
    assert calls == ["start", "stop"] * (START_ATTEMPTS - 1) + ["start"]


def test_other_errors_and_the_last_timeout_are_raised() -> None:
    stops: list[int] = []

    def broken() -> None:
        raise ValueError("bad argument")

    with pytest.raises(ValueError, match="bad argument"):
        start_with_retries(broken, lambda: stops.append(1))
    assert stops == []

    def slow() -> None:
        raise Exception("The current node timed out during startup.")

    with pytest.raises(Exception, match="timed out during startup"):
        start_with_retries(slow, lambda: stops.append(1))
    assert len(stops) == START_ATTEMPTS - 1
