"""``plan_upload`` without Ray: which route a checkpoint takes into a run's storage,
for each place the checkpoint, the storage and the caller may be, by the rules in
their order; and which checkpoints count as a local directory node storage takes."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from ray.train import Checkpoint

from air_transfer import TransferConfig
from air_transfer.train.plan import NodeStorage, Route, UploadPlan, local_directory, plan_upload

STORAGE_NODE, OTHER_NODE = "a" * 56, "b" * 56
OWN = TransferConfig(chunk_bytes=1 << 20)  # the storage's config
SINGLE = NodeStorage(STORAGE_NODE, replicated=False, config=OWN)
REPLICATED = NodeStorage(STORAGE_NODE, replicated=True, config=OWN)
INCREMENTAL = NodeStorage(STORAGE_NODE, replicated=False, config=OWN.replace(incremental=True))


def plan(
    storage: NodeStorage | None,
    *,
    source: str | None = "/src",
    node: str | None = None,
    here: str | None = OTHER_NODE,
    worker: str | None = None,
    config: TransferConfig | None = None,
) -> UploadPlan:
    return plan_upload(
        "/dest", config, storage=storage, source=source, node=node, here=here, worker=worker
    )


@pytest.mark.parametrize("storage", [None, SINGLE, REPLICATED])
def test_a_report_node_storage_cannot_take_is_left_to_ray(storage: NodeStorage | None) -> None:
    """Another filesystem, or a checkpoint that is not a local directory: Ray copies."""
    assert plan(storage, source=None, worker="w").route is Route.RAY
    if storage is None:
        assert plan(None, worker="w").route is Route.RAY


@pytest.mark.parametrize("worker", [None, "w"])
def test_replicated_storage_packs_once_for_every_copy_even_incremental(worker: str | None) -> None:
    chosen = plan(REPLICATED, worker=worker, config=OWN.replace(incremental=True))
    assert (chosen.route, chosen.source, chosen.worker) == (Route.REPLICAS, "/src", worker)


def test_incremental_comes_before_where_the_caller_stands() -> None:
    for here in (STORAGE_NODE, OTHER_NODE):
        for worker in (None, "w"):
            chosen = plan(INCREMENTAL, here=here, worker=worker)
            assert chosen.route is Route.INCREMENTAL and chosen.config.incremental


def test_a_report_is_read_from_the_disk_on_the_storage_node_and_packed_elsewhere() -> None:
    assert plan(SINGLE, here=STORAGE_NODE, worker="w").route is Route.FROM_DISK
    assert plan(SINGLE, here=OTHER_NODE, worker="w").route is Route.PACKED
    assert plan(SINGLE, node=STORAGE_NODE, here=OTHER_NODE, worker="w").route is Route.PACKED


def test_the_storage_config_is_the_default_of_its_own_routes_and_a_given_one_wins() -> None:
    assert plan(SINGLE, worker="w").config == OWN
    mine = TransferConfig(chunk_bytes=2 << 20)
    assert plan(SINGLE, worker="w", config=mine).config == mine


def test_checkpoint_upload_fn_writes_through_the_filesystem_by_the_right_agent() -> None:
    """Not a report: into replicated storage by this node's agent (its filesystem
    keeps every copy) unless another node is named, into node storage by the storage
    node's, else by the named node's (None: the head node's); with the default config."""
    named = plan(SINGLE, node=OTHER_NODE)
    assert (named.route, named.node, named.config) == (
        Route.THROUGH_FS,
        OTHER_NODE,
        TransferConfig(),
    )
    assert plan(SINGLE).node == STORAGE_NODE  # a local directory, not incremental
    assert plan(SINGLE, source=None).node == STORAGE_NODE
    assert plan(REPLICATED, source=None, here=OTHER_NODE).node == OTHER_NODE
    assert plan(REPLICATED, source=None, node=STORAGE_NODE).node == OTHER_NODE
    assert plan(None).node is None and plan(None).route is Route.THROUGH_FS
    assert plan(None, node=OTHER_NODE).node == OTHER_NODE


def test_a_local_directory_is_one_without_symlinks_on_the_local_filesystem(tmp_path: Path) -> None:
    (tmp_path / "d" / "sub").mkdir(parents=True)
    (tmp_path / "d" / "sub" / "f").write_bytes(b"x")
    assert local_directory(Checkpoint(str(tmp_path / "d"))) == str(tmp_path / "d")
    assert local_directory(Checkpoint(str(tmp_path / "d" / "sub" / "f"))) is None  # a file
    assert (
        local_directory(
            Checkpoint("/x", filesystem=pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()))
        )
        is None
    )
    os.symlink("f", tmp_path / "d" / "sub" / "link")
    assert local_directory(Checkpoint(str(tmp_path / "d"))) is None
