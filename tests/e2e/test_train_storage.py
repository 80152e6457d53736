"""Ray Train and Ray Tune on a mock cluster with ``storage_filesystem()`` as their
storage: workers on a non-driver node report checkpoints, which land on the driver
node's disk, are pruned, and are restored from on other nodes, byte for byte.

The nodes of a mock cluster share one disk, so a wrong path would still find the
files: every check reads what landed at the storage path and compares digests taken
by the worker that wrote the checkpoint. A worker failing right after a report, and
the restart restoring what it reported: ``test_train_failures.py``.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray.train
import ray.tune
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

import air_transfer
from air_transfer import TransferConfig
from air_transfer.storage.client.handler import node_storage_handler
from tests.support.checkpoints import MiB, digest_tree
from tests.support.cluster import node_ids
from tests.support.incremental_train import (
    INCREMENTAL,
    MOST_SENT,
    assert_kept_whole,
    fit_frozen,
    sent_to_head,
)
from tests.support.train_fns import report_directory, train_loop, tune_trainable

pytestmark = pytest.mark.usefixtures("cluster")
CONFIG = TransferConfig(chunk_bytes=MiB, window=4)
SIZE = 3 * MiB + 5  # model.bin: four chunks; the checkpoint has five more small files
ON_NODE_A = {"CPU": 1, "node_a": 0.01}


def fit(
    storage: Path,
    name: str,
    filesystem: pafs.FileSystem | None = None,
    num_to_keep: int | None = None,
    max_failures: int = 0,
    **loop_config: Any,
) -> ray.train.Result:
    trainer = DataParallelTrainer(
        train_loop,
        train_loop_config={"size": SIZE, **loop_config},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker=ON_NODE_A),
        run_config=ray.train.RunConfig(
            name=name,
            storage_path=str(storage),
            storage_filesystem=filesystem,
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=num_to_keep),
            failure_config=ray.train.FailureConfig(max_failures=max_failures),
        ),
    )
    return trainer.fit()


def checkpoint_dirs(experiment: Path) -> list[str]:
    dirs = (p for p in experiment.iterdir() if p.is_dir())
    return sorted(p.name for p in dirs if p.name.startswith("checkpoint_"))


def assert_landed(result: ray.train.Result, storage: Path, name: str) -> None:
    """Every kept checkpoint sits at its path under ``storage`` on the driver node's
    disk with the bytes its worker (on node a) reported, and reads back identically."""
    ids = node_ids()
    kept = result.best_checkpoints
    assert kept, "no checkpoint was kept"
    for checkpoint, metrics in kept:
        assert node_storage_handler(checkpoint.filesystem).node_id == ids["head"]
        assert Path(checkpoint.path).parent == storage / name
        assert metrics["node"] == ids["node_a"]
        assert digest_tree(checkpoint.path) == metrics["digests"]
    restored = result.checkpoint.to_directory(tempfile.mkdtemp(prefix="restored-", dir=storage))
    assert digest_tree(restored) == kept[-1][1]["digests"]


@pytest.fixture(scope="module")
def fs(tmp_path_factory: pytest.TempPathFactory) -> pafs.FileSystem:
    """Node storage on the head node, rooted at the session's temporary directory."""
    return air_transfer.storage_filesystem(config=CONFIG, root=str(tmp_path_factory.getbasetemp()))


@pytest.fixture(scope="module")
def sync_run(
    tmp_path_factory: pytest.TempPathFactory, fs: pafs.FileSystem
) -> tuple[Any, Path, int]:
    """A run of 3 SYNC reports keeping 2; also how many checkpoints the storage
    node's agent stored meanwhile."""
    storage = tmp_path_factory.mktemp("storage")
    before = storage_counters()["checkpoints_stored"]
    result = fit(storage, "sync", fs, num_to_keep=2, steps=3, mode="SYNC")
    return result, storage, storage_counters()["checkpoints_stored"] - before


def test_sync_reports_land_on_the_driver_node_and_old_ones_are_deleted(
    sync_run: tuple[ray.train.Result, Path, int],
) -> None:
    result, storage, _ = sync_run
    assert_landed(result, storage, "sync")
    assert [m["step"] for _, m in result.best_checkpoints] == [1, 2]
    assert checkpoint_dirs(storage / "sync") == sorted(
        Path(c.path).name for c, _ in result.best_checkpoints
    )


def test_async_reports_land_on_the_driver_node(tmp_path: Path, fs: pafs.FileSystem) -> None:
    result = fit(tmp_path, "async", fs, num_to_keep=2, steps=3, mode="ASYNC")
    assert_landed(result, tmp_path, "async")
    assert [m["step"] for _, m in result.best_checkpoints] == [1, 2]
    assert len(checkpoint_dirs(tmp_path / "async")) == 2


def test_a_second_run_with_the_same_name_resumes(
    sync_run: tuple[ray.train.Result, Path, int], fs: pafs.FileSystem
) -> None:
    first, storage, _ = sync_run
    last_checkpoint, last_metrics = first.best_checkpoints[-1]
    result = fit(storage, "sync", fs, num_to_keep=2, steps=4, mode="SYNC")
    resumed = result.metrics
    assert resumed["step"] == 3 and resumed["restored_step"] == 2
    assert resumed["restored_path"] == last_checkpoint.path
    assert resumed["restored_digests"] == last_metrics["digests"]
    assert_landed(result, storage, "sync")


def test_checkpoint_upload_fn_into_another_storage(tmp_path: Path) -> None:
    """A run on ordinary storage (here a local path) uploading through the head node's
    agent, in chunks."""
    upload = functools.partial(air_transfer.checkpoint_upload_fn, config=CONFIG)
    result = fit(tmp_path, "upload", steps=2, mode="SYNC", upload_fn=upload)
    for checkpoint, metrics in result.best_checkpoints:
        assert isinstance(checkpoint.filesystem, pafs.LocalFileSystem)
        assert Path(checkpoint.path).parent == tmp_path / "upload"
        assert digest_tree(checkpoint.path) == metrics["digests"]
    assert len(result.best_checkpoints) == 2


def test_tune_function_trainable_reports_and_restores(tmp_path: Path, fs: pafs.FileSystem) -> None:
    marker = tmp_path / "failed-once"
    tuner = ray.tune.Tuner(
        ray.tune.with_resources(tune_trainable, ON_NODE_A),
        param_space={"size": SIZE, "steps": 3, "fail_after": 1, "fail_marker": str(marker)},
        run_config=ray.tune.RunConfig(
            name="tune",
            storage_path=str(tmp_path),
            storage_filesystem=fs,
            failure_config=ray.tune.FailureConfig(max_failures=1),
        ),
    )
    [result] = tuner.fit()
    assert result.error is None and marker.exists()
    history = {m["step"]: m for _, m in result.best_checkpoints}
    assert history[2]["restored_step"] == 1
    assert history[2]["restored_digests"] == history[1]["digests"]
    for checkpoint, metrics in result.best_checkpoints:
        assert node_storage_handler(checkpoint.filesystem).node_id == node_ids()["head"]
        assert Path(checkpoint.path).is_relative_to(tmp_path / "tune")
        assert metrics["node"] == node_ids()["node_a"]
        assert digest_tree(checkpoint.path) == metrics["digests"]
    restored = result.checkpoint.to_directory(str(tmp_path / "restored"))
    assert digest_tree(restored) == history[2]["digests"]


def storage_counters() -> dict[str, int]:
    counters: dict[str, int] = ray.get(
        air_transfer.cluster.nodes.node_agent(node_ids()["head"]).read_counters.remote()
    )
    return counters


def test_reports_go_through_one_chunked_transfer_each(
    sync_run: tuple[ray.train.Result, Path, int],
) -> None:
    """A worker's ``report`` into node storage is not pyarrow's file-by-file
    copy (every byte through a Python ``bytes``) but one transfer per checkpoint,
    written by the storage node's agent (the hooks that ``train.hooks.install`` sets up)."""
    _, _, stored = sync_run
    assert stored == 3


@ray.remote(num_cpus=0)
def restore_digests(checkpoint: ray.train.Checkpoint) -> dict[str, str]:
    # A directory of its own: without one, Ray's to_directory() picks one path per
    # checkpoint, and on a mock cluster (one disk) a second node may find it filled.
    d = checkpoint.to_directory(tempfile.mkdtemp(prefix="restore-"))
    try:
        return digest_tree(d)
    finally:
        shutil.rmtree(d)


def test_restores_on_other_nodes_share_one_transfer(
    sync_run: tuple[ray.train.Result, Path, int],
) -> None:
    """Two workers restoring one checkpoint on other nodes at once: the storage node
    packs it once (one directory transfer), both get its exact bytes."""
    result, _, _ = sync_run
    before = storage_counters()
    checkpoint = result.checkpoint
    assert checkpoint is not None
    restores = [
        restore_digests.options(resources={node: 0.01}).remote(checkpoint)
        for node in ("node_a", "node_b")
    ]
    expected = result.best_checkpoints[-1][1]["digests"]
    assert ray.get(restores) == [expected, expected]
    after = storage_counters()
    size = sum(  # the storage node is this machine's head node
        os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(checkpoint.path) for f in fs
    )
    assert after["transfers_packed"] - before["transfers_packed"] == 1
    assert after["bytes_read"] - before["bytes_read"] == size  # read from disk once
    assert after["bytes_served"] - before["bytes_served"] == 2 * size  # to each reader


def stored_tree(root: Path) -> dict[str, tuple[str, str]]:
    """relative path -> (kind, sha256 of a file's bytes or a link's target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = ("symlink", os.readlink(path))
        elif path.is_dir():
            out[rel] = ("dir", "")
        else:
            out[rel] = ("file", hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def test_a_checkpoint_holding_symlinks_is_stored_as_rays_own_copy_stores_it(
    tmp_path: Path, fs: pafs.FileSystem
) -> None:
    """A reported checkpoint holding a symlink to a file outside it failed the report
    under the hooks (ManifestError), where Ray's own copy stores the file. Reported
    from another node into node storage, it is stored exactly as Ray's own path
    stores it into a local filesystem: every link replaced by what it points to
    (a file, a directory), a dangling one left out."""
    outside = tmp_path / "outside"
    (outside / "d").mkdir(parents=True)
    (outside / "f").write_bytes(b"outside file")
    (outside / "d" / "g").write_bytes(b"in a directory outside")
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "a").write_bytes(b"a")
    (source / "sub" / "b").write_bytes(b"b")
    (source / "to_outside_file").symlink_to(os.path.relpath(outside / "f", source))
    (source / "sub" / "absolute_to_outside").symlink_to(outside / "f")
    (source / "to_outside_dir").symlink_to(outside / "d")
    (source / "to_inside_file").symlink_to("a")
    (source / "dangling").symlink_to("nowhere")
    stored = {}
    for name, filesystem in (("ray-local", None), ("storage_filesystem", fs)):
        trainer = DataParallelTrainer(
            report_directory,
            train_loop_config={"source": str(source)},
            scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker=ON_NODE_A),
            run_config=ray.train.RunConfig(
                name=name, storage_path=str(tmp_path / name), storage_filesystem=filesystem
            ),
        )
        checkpoint = trainer.fit().checkpoint
        assert checkpoint is not None
        stored[name] = stored_tree(Path(checkpoint.path))
    assert stored["storage_filesystem"] == stored["ray-local"]
    file_digest = hashlib.sha256(b"outside file").hexdigest()
    assert stored["ray-local"]["to_outside_file"] == ("file", file_digest)
    assert stored["ray-local"]["to_outside_dir/g"][0] == "file"


def test_incremental_checkpoint_upload_fn_sends_what_changed(tmp_path: Path) -> None:
    """``checkpoint_upload_fn`` with ``incremental=True`` into node storage: only the
    changed bytes travel, the frozen file is stored once."""
    before = sent_to_head()
    upload = functools.partial(air_transfer.checkpoint_upload_fn, config=INCREMENTAL)
    fs = air_transfer.storage_filesystem(root=str(tmp_path))
    result = fit_frozen(tmp_path, "incremental", fs, upload_fn=upload)
    assert_kept_whole(result)
    assert sent_to_head() - before <= MOST_SENT
