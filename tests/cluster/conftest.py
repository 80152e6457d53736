"""Fixtures of the cluster tier: the two-node mock cluster the suite shares
(``tests.support.cluster.shared_cluster``), the check every test on it gets, and node
storage on one of its nodes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from ray.cluster_utils import Cluster

from air_transfer import storage_filesystem
from tests.support.cluster import chunks_back_to_baseline, node_ids, two_node_cluster
from tests.support.node_storage import CONFIG


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Head (driver) plus nodes ``node_a`` and ``node_b`` (also ``trainer``)."""
    yield from two_node_cluster()


@pytest.fixture(autouse=True)
def no_chunks_left_pinned() -> Iterator[None]:
    """After each test, every node's object store returns to its baseline."""
    yield from chunks_back_to_baseline()


@pytest.fixture
def node_fs(tmp_path: Path) -> tuple[pafs.FileSystem, Path]:
    """Node storage on ``node_a`` rooted at ``root`` (holding ``d/f``, and ``link``
    pointing at the directory above, which holds ``secret``)."""
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"inside")
    (tmp_path / "secret").write_bytes(b"outside")
    (root / "link").symlink_to(tmp_path)
    return storage_filesystem(node=node_ids()["node_a"], config=CONFIG, root=str(root)), root
