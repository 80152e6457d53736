"""The Ray compatibility gate. Ray's private API lives in one module,
``air_transfer.cluster._ray``: every private name it uses still exists in the
installed Ray, and no other module of the package reaches for one (no Ray instance:
the Train hooks are installed in fresh interpreters). ``pyproject.toml`` pins Ray to
the minor versions this passes on; to support the next one, install it and run this
module: a name that moved fails here, by name."""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

import pytest

import air_transfer
from air_transfer.cluster import _ray
from tests.support.procs import REPO_ROOT, child_env

#: The whole package (``_ray``'s own folder, ``cluster/``, is only one of its layers).
PACKAGE = Path(air_transfer.__file__).parent
#: What a use of Ray's private API looks like in source.
PRIVATE_USE = re.compile(
    r"ray\._private|ray\.tune\.utils\.file_transfer|_generator_backpressure|"
    r"_get_temporary_checkpoint_dir|\._uuid\b|\._actor_id\b|\._PackActor\b|"
    r"_force_on_node|_unpack_from_actor|internal_kv"
)


@pytest.mark.parametrize(
    ("module", "name"), _ray.PRIVATE_NAMES, ids=[f"{m}:{n}" for m, n in _ray.PRIVATE_NAMES]
)
def test_each_private_name_exists_in_the_installed_ray(module: str, name: str) -> None:
    owner = importlib.import_module(module)
    assert functools.reduce(getattr, name.split("."), owner) is not None


def test_the_backpressure_option_is_one_ray_accepts() -> None:
    from ray._common.ray_option_utils import task_options

    assert _ray.BACKPRESSURE_OPTION in task_options


def test_no_other_module_uses_rays_private_api() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "_ray.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_USE.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


def _run(code: str, **env: str) -> str:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", code],
        env=child_env(**env),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout.strip()


TRAIN_HOOKS = """
from ray.train import _checkpoint
from ray.train.v2._internal.execution import storage
from air_transfer.cluster import _ray
from ray.train.v2._internal.execution import context
from ray.train.v2._internal.execution.checkpoint import checkpoint_manager
def hooked():
    return (
        storage.StorageContext.persist_current_checkpoint,
        _checkpoint._download_from_fs_path,
        context.TrainContext.report,
        checkpoint_manager.CheckpointManager.before_worker_group_shutdown,
    )
before = hooked()
installed = _ray.install_train_hooks(
    lambda fs, path, ckpt, worker: None,
    lambda fs, path, local: False,
    lambda fs, workers, tracked: None,
)
after = hooked()
changed = [b != a for b, a in zip(before, after)]
assert all(changed) or not any(changed), changed
print(installed, before == after)
"""


def test_train_hooks_can_be_turned_off() -> None:
    """``AIR_TRANSFER_TRAIN_HOOKS=0`` leaves Ray Train's own copies untouched (the
    hooks installed by default: the next test)."""
    assert _run(TRAIN_HOOKS, AIR_TRANSFER_TRAIN_HOOKS="0") == "False True"


def test_train_hooks_leave_every_other_filesystem_to_ray(tmp_path: Path) -> None:
    """Installed, the download wrapper asks the hook, which declines for a local
    filesystem, and Ray's own copy runs: the directory arrives."""
    (tmp_path / "src" / "sub").mkdir(parents=True)
    (tmp_path / "src" / "sub" / "f").write_bytes(b"data")
    code = TRAIN_HOOKS + (
        "import pyarrow.fs as pafs\n"
        f"_checkpoint._download_from_fs_path(pafs.LocalFileSystem(), {str(tmp_path / 'src')!r}, "
        f"{str(tmp_path / 'out')!r})\n"
    )
    assert _run(code) == "True False"
    assert (tmp_path / "out" / "sub" / "f").read_bytes() == b"data"


PROPAGATED = """
from ray.train.v2._internal.constants import get_env_vars_to_propagate
before = get_env_vars_to_propagate().get("AIR_TRANSFER_PROGRESS")
import air_transfer.train
print(before, get_env_vars_to_propagate().get("AIR_TRANSFER_PROGRESS"))
"""


def test_ray_train_copies_the_settings_once_the_library_is_imported() -> None:
    """What Ray Train copies from the driver to its controller, and from the
    controller to its workers, is its own list: importing the library adds every
    ``AIR_TRANSFER_*`` setting to it (the run itself: tests/e2e/test_dcp_conventions.py)."""
    assert _run(PROPAGATED, AIR_TRANSFER_PROGRESS="1") == "None 1"


@pytest.mark.parametrize("module", ["air_transfer.dcp", "air_transfer.train"])
def test_train_v1_is_refused_at_import_saying_what_to_do(module: str) -> None:
    """Defect: with Train v1 selected, ``air_transfer.dcp`` failed deep inside with
    "cannot import name 'CheckpointUploadMode'"."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", f"import {module}"],
        env=child_env(RAY_TRAIN_V2_ENABLED="0"),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "ImportError: air-transfer needs Ray Train v2" in done.stderr, done.stderr
    assert "unset RAY_TRAIN_V2_ENABLED" in done.stderr
