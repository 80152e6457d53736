"""The tools' own uses of Ray's private API (``benchmarks.bench.tune``) still exist in
the installed Ray: an upgrade that moves one breaks this test, not a bench run."""

from __future__ import annotations

import functools
import importlib

import pytest

from benchmarks.bench import tune


@pytest.mark.parametrize(
    ("module", "name"), tune.PRIVATE_NAMES, ids=[f"{m}:{n}" for m, n in tune.PRIVATE_NAMES]
)
def test_each_private_name_the_bench_uses_exists(module: str, name: str) -> None:
    owner = importlib.import_module(module)
    assert functools.reduce(getattr, name.split("."), owner) is not None
