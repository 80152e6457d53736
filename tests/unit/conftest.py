"""The unit tier starts no Ray: a test that leaves Ray running fails (it belongs in
``tests/ray``), and Ray is shut down so that the next test starts without it."""

from __future__ import annotations

from collections.abc import Generator

import pytest
import ray


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    started = False
    running = ray.is_initialized()  # a Ray shared by an earlier tier's modules
    try:
        result = yield
    finally:  # a test that failed and started Ray still leaves none running
        if ray.is_initialized() and not running:
            ray.shutdown()
            started = True
    if started:
        raise AssertionError(
            f"{item.nodeid} started Ray: the unit tier runs without a Ray instance "
            "(move the test to tests/ray, or keep Ray out of it)"
        )
    return result
