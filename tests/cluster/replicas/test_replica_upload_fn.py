"""``checkpoint_upload_fn`` into replicated node storage (its work, called directly:
``upload_checkpoint``, as a Train worker's report calls it): every copy takes the
checkpoint, incremental or not, and when the storage node is gone the next one is
stored on the live copies, restores byte for byte, and is repaired onto a live
node."""

from __future__ import annotations

from pathlib import Path

import pytest
from ray.cluster_utils import Cluster
from ray.train import Checkpoint

from air_transfer import TransferConfig
from air_transfer.train import upload_checkpoint
from air_transfer.train.hooks import download_directory
from tests.support.checkpoints import MiB, digest_tree, make_checkpoint
from tests.support.cluster import node_ids
from tests.support.replicas import copies_identical, remove, replicated, tree, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


def test_upload_fn_writes_every_copy_and_fails_over(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    config = TransferConfig(chunk_bytes=MiB, window=2, incremental=True)
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],), config=config)
    src = make_checkpoint(tmp_path / "src", 2 * MiB)
    first, second = f"{h.root}/run/checkpoint_0", f"{h.root}/run/checkpoint_1"
    assert upload_checkpoint(fs, first, Checkpoint.from_directory(str(src))).path == first
    expected = {p: b for p, b in tree(str(src)).items() if b is not None}

    def files(name: str, copies: dict[str, bytes | None]) -> dict[str, bytes]:
        prefix = f"run/{name}/"
        return {
            p[len(prefix) :]: b for p, b in copies.items() if p.startswith(prefix) and b is not None
        }

    assert files("checkpoint_0", copies_identical(h, 2)) == expected
    remove(cluster4, node_ids()[w[0]])  # the storage node
    assert upload_checkpoint(fs, second, Checkpoint.from_directory(str(src))).path == second
    assert download_directory(fs, second, str(tmp_path / "restored"))
    assert digest_tree(tmp_path / "restored") == digest_tree(src)
    copies = copies_identical(h, 2)  # repaired onto a live node: both checkpoints
    assert files("checkpoint_0", copies) == files("checkpoint_1", copies) == expected
