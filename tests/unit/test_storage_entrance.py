"""Node storage's entrance without Ray: the root a ``storage_filesystem()`` gets by
default (air-transfer's own directory, never ``/``), the roots refused because they
would expose the storage node's system directories, and ``run_config()``: one call
whose ``RunConfig`` says the root once, refusing a storage path outside it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray.train

import air_transfer
from air_transfer import StorageConfig, run_config, storage_filesystem

HOME_ROOT = os.path.expanduser("~/air_transfer")


def test_without_a_root_the_storage_is_air_transfers_own_directory_never_slash() -> None:
    assert storage_filesystem().handler.root == HOME_ROOT != "/"
    assert run_config().storage_filesystem.handler.root == HOME_ROOT


@pytest.mark.parametrize(
    "root",
    ["/", "//", "/etc", "/etc/ssh", "/usr", "/usr/lib/x", "/proc/1", "/home", "/tmp", "/var"],
)
def test_a_root_exposing_system_directories_is_refused_unless_asked_for(root: str) -> None:
    with pytest.raises(ValueError, match=r"would let every process.*expose_system_dirs=True"):
        storage_filesystem(root=root)
    with pytest.raises(ValueError, match="expose_system_dirs=True"):
        run_config(root=root)
    asked = storage_filesystem(root=root, expose_system_dirs=True)
    assert asked.handler.root == os.path.normpath(root).replace("//", "/")


@pytest.mark.parametrize(
    "root", ["/tmp/run", "/home/me/ckpt", "/var/lib/ckpt", "/root/air_transfer", "/data"]
)
def test_a_directory_of_ones_own_is_a_root(root: str) -> None:
    assert storage_filesystem(root=root).handler.root == root


def test_a_durable_tier_still_needs_a_root_of_its_own() -> None:
    with pytest.raises(ValueError, match="needs a root of its own"):
        storage_filesystem(root="/", expose_system_dirs=True, durable="file:///nowhere")


def test_run_config_says_the_root_once(tmp_path: Path) -> None:
    failure = ray.train.FailureConfig(max_failures=2)
    made = run_config(
        root=str(tmp_path),
        name="run",
        storage=StorageConfig(incremental=True),
        failure_config=failure,
    )
    assert isinstance(made, ray.train.RunConfig)
    assert made.storage_path == str(tmp_path) == made.storage_filesystem.handler.root
    assert made.name == "run" and made.failure_config == failure
    assert made.storage_filesystem.handler.config.incremental
    inside = run_config(root=str(tmp_path), storage_path=str(tmp_path / "runs"))
    assert inside.storage_path == str(tmp_path / "runs")
    assert run_config(root=str(tmp_path), storage_path="runs").storage_path == inside.storage_path


@pytest.mark.parametrize("outside", ["/elsewhere", "../sibling", "/"])
def test_a_storage_path_outside_the_root_is_refused_at_the_call(
    tmp_path: Path, outside: str
) -> None:
    with pytest.raises(ValueError, match=r"storage_path .* is outside the storage root"):
        run_config(root=str(tmp_path / "root"), storage_path=outside)


def test_run_config_makes_the_filesystem_itself(tmp_path: Path) -> None:
    fs = storage_filesystem(root=str(tmp_path))
    with pytest.raises(TypeError, match="makes the storage filesystem itself"):
        run_config(root=str(tmp_path), storage_filesystem=fs)
    assert air_transfer.run_config is run_config
