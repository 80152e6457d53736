"""The public API as users meet it, without Ray: which names each public module
exports, that everything public says what it does, and that calls in the old or a
wrong form fail with an error that says what to write instead."""

from __future__ import annotations

import importlib
import inspect
import pickle
import warnings
from typing import Any

import pytest

import air_transfer
import air_transfer.extend

#: What a user of air-transfer needs (the package root).
USER_API = {
    "CheckpointInfo",
    "CheckpointLostError",
    "ChecksumError",
    "ChunkedCheckpoint",
    "ManifestError",
    "SourceChangedError",
    "StorageConfig",
    "StorageState",
    "TransferConfig",
    "TransferFuture",
    "checkpoint_upload_fn",
    "list_checkpoints",
    "node_agent",
    "replica_status",
    "run_config",
    "shutdown_agents",
    "storage_filesystem",
    "storage_state",
    "wait_durable",
}
#: What a new strategy or a tool reading a packed checkpoint's parts builds on.
EXTENSION_API = {
    "Entry",
    "Manifest",
    "PackRequest",
    "Packed",
    "TransferHandle",
    "TransferStrategy",
    "get_strategy",
    "register_strategy",
    "select_strategy",
    "strategies",
}
PUBLIC_MODULES = ["air_transfer", "air_transfer.extend", "air_transfer.dcp"]


def test_the_root_exports_the_user_api_and_extend_the_extension_api() -> None:
    assert set(air_transfer.__all__) == USER_API
    assert set(air_transfer.extend.__all__) == EXTENSION_API
    assert set(importlib.import_module("air_transfer.dcp").__all__) == {
        "NodeStorageReader",
        "NodeStorageWriter",
        "load",
        "report",
        "wait_for_pending_save",
    }


@pytest.mark.parametrize("name", sorted(EXTENSION_API - {"TransferHandle"}))
def test_the_extension_api_is_still_importable_from_the_root_with_a_warning(name: str) -> None:
    """Exported by the root before: still there for a release, saying where it went."""
    with pytest.warns(DeprecationWarning, match=rf"air_transfer\.extend\.{name}"):
        old = getattr(air_transfer, name)
    assert old is getattr(air_transfer.extend, name)


def test_the_user_api_warns_of_nothing() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for name in USER_API:
            getattr(air_transfer, name)


def _public_members(obj: Any) -> list[tuple[str, Any]]:
    """The public methods and properties a class defines itself."""
    return [
        (name, value)
        for name, value in vars(obj).items()
        if not name.startswith("_")
        and (inspect.isfunction(value) or isinstance(value, (property, classmethod, staticmethod)))
    ]


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_everything_public_has_a_docstring(module: str) -> None:
    """Every exported class and function, and every public method and property its
    classes define, says what it does (the API reference is generated from these;
    data, such as the ``strategies`` view, is documented by its ``#:`` comment)."""
    loaded = importlib.import_module(module)
    assert inspect.getdoc(loaded), module
    missing = []
    for name in loaded.__all__:
        obj = getattr(loaded, name)
        if callable(obj) and not (obj.__doc__ or "").strip():
            missing.append(name)
        if inspect.isclass(obj):
            for member, value in _public_members(obj):
                function = value.fget if isinstance(value, property) else value
                function = getattr(function, "__func__", function)
                if not (function.__doc__ or "").strip():
                    missing.append(f"{name}.{member}")
    assert missing == []


# -- storage_filesystem(node=...) ------------------------------------------------------
def test_storage_filesystem_takes_no_positional_arguments() -> None:
    """A path given where the node went is refused, saying where a path goes."""
    from air_transfer import storage_filesystem

    with pytest.raises(TypeError, match=r"keyword arguments only.*storage_path"):
        storage_filesystem("/abs/dir")  # type: ignore[misc]


@pytest.mark.parametrize("node", ["/abs/dir", "node-a", "ab" * 27, "", 7, "HEAD"])
def test_a_node_in_no_known_form_is_refused_before_ray_starts(node: Any) -> None:
    from air_transfer import storage_filesystem

    with pytest.raises(ValueError, match=r"node must be a Ray node id.*IP address.*'head'"):
        storage_filesystem(node=node)


@pytest.mark.parametrize("node", ["head", "10.0.0.7", "fe80::1", "ab" * 28])
def test_each_form_of_node_is_kept_until_ray_can_resolve_it(node: str) -> None:
    """Made before ``ray.init``: accepted, named in its repr, and shipped as written
    (resolved by the process that first uses it)."""
    from air_transfer import storage_filesystem

    fs = storage_filesystem(node=node, root="/data/checkpoints")
    assert node[:12] in repr(fs.handler)
    assert pickle.loads(pickle.dumps(fs)).handler._node_id == node


# -- air_transfer.dcp.report: ray.train.report's order --------------------------------
def test_dcp_report_in_the_old_order_says_the_new_one() -> None:
    from air_transfer.dcp import report

    with pytest.raises(TypeError, match=r"report\(metrics, state_dict=state_dict"):
        report({"w": 1}, {"loss": 0.5})  # type: ignore[misc]


def test_dcp_report_refuses_no_upload() -> None:
    from ray.train import CheckpointUploadMode

    from air_transfer.dcp import report

    with pytest.raises(ValueError, match="the save is the upload"):
        report({}, state_dict={}, checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)


def test_dcp_report_async_save_is_a_deprecated_spelling() -> None:
    """Still accepted (it then needs a Train worker, as every report does)."""
    from air_transfer.dcp import report

    with (
        pytest.warns(DeprecationWarning, match="checkpoint_upload_mode"),
        pytest.raises(RuntimeError, match="outside of a Ray Train training function"),
    ):
        report({}, state_dict={}, async_save=True)


@pytest.mark.parametrize("cls", ["NodeStorageWriter", "NodeStorageReader"])
def test_dcp_storage_without_a_filesystem_outside_ray_names_the_fix(cls: str) -> None:
    dcp = importlib.import_module("air_transfer.dcp")
    with pytest.raises(ValueError, match=rf"storage_filesystem.*{cls}\('/ckpt', fs\)"):
        getattr(dcp, cls)("/ckpt")


def test_every_setting_the_package_reads_is_in_the_one_list() -> None:
    """What is in ``core.environ.SETTINGS`` travels to Train's processes and the
    agents; a variable read elsewhere would not."""
    import re
    from pathlib import Path

    from air_transfer.core import environ

    package = Path(air_transfer.__file__).parent
    named = {
        name
        for path in package.rglob("*.py")
        for name in re.findall(r"AIR_TRANSFER_[A-Z0-9_]+", path.read_text())
    }
    assert named == set(environ.SETTINGS)
