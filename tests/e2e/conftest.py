"""Fixtures of the end-to-end tier: the two-node mock cluster the suite shares (for
the Train runs) and its check, from ``tests.support.cluster`` as in the cluster tier."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from ray.cluster_utils import Cluster

from tests.support.cluster import chunks_back_to_baseline, two_node_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head (driver) plus nodes ``node_a`` and ``node_b`` (also ``trainer``)."""
    yield from two_node_cluster()


@pytest.fixture(autouse=True)
def no_chunks_left_pinned() -> Iterator[None]:
    """After each test, every node's object store returns to its baseline."""
    yield from chunks_back_to_baseline()
