"""The Ray compatibility gate. Ray's private API lives in two modules,
``air_transfer.cluster._ray`` (Ray Train's) and ``_ray_core`` (Ray core's): every
private name they use still exists in the installed Ray, and no other module of the
package reaches for one (no Ray instance:
the Train hooks are installed in fresh interpreters). ``pyproject.toml`` pins Ray to
the minor versions this passes on; to support the next one, install it and run this
module: a name that moved fails here, by name."""

from __future__ import annotations

import functools
import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

import air_transfer
from air_transfer.cluster import _ray_core
from air_transfer.cluster._ray_names import PRIVATE_NAMES
from tests.support.procs import REPO_ROOT, child_env

#: The whole package (``_ray``'s own folder, ``cluster/``, is only one of its layers).
PACKAGE = Path(air_transfer.__file__).parent
#: What a use of Ray's private API looks like in source.
PRIVATE_USE = re.compile(
    r"ray\._private|ray\.tune\.utils\.file_transfer|_generator_backpressure|"
    r"_get_temporary_checkpoint_dir|\._uuid\b|\._actor_id\b|\._PackActor\b|"
    r"_force_on_node|_unpack_from_actor|internal_kv"
)


#: The modules that may use Ray's private API, and the table of the names they use.
OWNERS = ("_ray.py", "_ray_core.py", "_ray_hooks.py", "_ray_names.py")


@pytest.mark.parametrize(
    ("module", "name"), PRIVATE_NAMES, ids=[f"{m}:{n}" for m, n in PRIVATE_NAMES]
)
def test_each_private_name_exists_in_the_installed_ray(module: str, name: str) -> None:
    owner = importlib.import_module(module)
    assert functools.reduce(getattr, name.split("."), owner) is not None


def test_the_backpressure_option_is_one_ray_accepts() -> None:
    from ray._common.ray_option_utils import task_options

    assert _ray_core.BACKPRESSURE_OPTION in task_options


def test_no_other_module_uses_rays_private_api() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if path.parent.name != "cluster" or path.name not in OWNERS
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_USE.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []


TRAIN_HOOKS = """
import types
from ray.train import _checkpoint
from ray.train.v2._internal.execution import storage
from air_transfer.cluster import _ray_hooks
from ray.train.v2._internal.execution import context
from ray.train.v2._internal.execution.checkpoint import checkpoint_manager
def hooked():
    return (
        storage.StorageContext.persist_current_checkpoint,
        _checkpoint._download_from_fs_path,
        context.TrainContext.report,
        checkpoint_manager.CheckpointManager.before_worker_group_shutdown,
        checkpoint_manager.CheckpointManager.before_init_train_context,
        checkpoint_manager.CheckpointManager.after_report,
    )
before = hooked()
installed = _ray_hooks.install_train_hooks(
    lambda fs, path, ckpt, worker: None,
    lambda fs, path, local: False,
    lambda fs, workers, tracked: None,
    types.SimpleNamespace(ours=lambda fs: False),
)
installed = _ray_hooks.install_restore_choice(lambda fs, paths: paths[0]) and installed
after = hooked()
changed = [b != a for b, a in zip(before, after)]
assert all(changed) or not any(changed), changed
print(installed, before == after)
"""

PROPAGATED = """
from ray.train.v2._internal.constants import get_env_vars_to_propagate
before = get_env_vars_to_propagate().get("AIR_TRANSFER_PROGRESS")
import air_transfer.train
print(before, get_env_vars_to_propagate().get("AIR_TRANSFER_PROGRESS"))
"""

#: Each module that needs Train v2 imported with v1 selected, in one interpreter:
#: what each import raised, after a ``--- module`` line. ``air_transfer.train`` first
#: (nothing imported before it); ``air_transfer.dcp`` checks first thing, before
#: anything the failed import left behind could matter.
V1_IMPORTS = """
import traceback
for module in ("air_transfer.train", "air_transfer.dcp"):
    print("---", module, flush=True)
    try:
        __import__(module)
    except BaseException:
        print(traceback.format_exc(), flush=True)
    else:
        print("imported", flush=True)
"""

#: What a fresh interpreter did: its exit status, stdout and stderr.
Finished = subprocess.CompletedProcess[str]

#: Each check that needs a fresh interpreter (what Ray Train looks like before and
#: after the library is imported, or with other settings): its code and environment.
#: Each imports Ray (~2 s), so they all start at once, the first time one is needed.
FRESH = {
    "hooks off": (TRAIN_HOOKS, {"AIR_TRANSFER_TRAIN_HOOKS": "0"}),
    "hooks on, local fs": (
        TRAIN_HOOKS
        + "import pyarrow.fs as pafs, sys\n"
        + "_checkpoint._download_from_fs_path(pafs.LocalFileSystem(), sys.argv[1], sys.argv[2])\n",
        {},
    ),
    "propagated": (PROPAGATED, {"AIR_TRANSFER_PROGRESS": "1"}),
    "v1": (V1_IMPORTS, {"RAY_TRAIN_V2_ENABLED": "0"}),
}


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Finished]]:
    """Every ``FRESH`` check run, each in a new interpreter, all at once: a directory
    for the download check (``src`` in it, copied to ``out``) and each one's outcome."""
    where = tmp_path_factory.mktemp("fresh")
    (where / "src" / "sub").mkdir(parents=True)
    (where / "src" / "sub" / "f").write_bytes(b"data")
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", code, str(where / "src"), str(where / "out")],
            env=child_env(**env),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (code, env) in FRESH.items()
    }
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return where, done


def printed(done: Finished) -> str:
    """What a fresh interpreter that exited well printed (stripped)."""
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_train_hooks_can_be_turned_off(fresh: tuple[Path, dict[str, Finished]]) -> None:
    """``AIR_TRANSFER_TRAIN_HOOKS=0`` leaves Ray Train's own copies untouched (the
    hooks installed by default: the next test)."""
    assert printed(fresh[1]["hooks off"]) == "False True"


def test_train_hooks_leave_every_other_filesystem_to_ray(
    fresh: tuple[Path, dict[str, Finished]],
) -> None:
    """Installed, the download wrapper asks the hook, which declines for a local
    filesystem, and Ray's own copy runs: the directory arrives."""
    where, done = fresh
    assert printed(done["hooks on, local fs"]) == "True False"
    assert (where / "out" / "sub" / "f").read_bytes() == b"data"


def test_ray_train_copies_the_settings_once_the_library_is_imported(
    fresh: tuple[Path, dict[str, Finished]],
) -> None:
    """What Ray Train copies from the driver to its controller, and from the
    controller to its workers, is its own list: importing the library adds every
    ``AIR_TRANSFER_*`` setting to it (the run itself: tests/e2e/test_dcp_conventions.py)."""
    assert printed(fresh[1]["propagated"]) == "None 1"


@pytest.mark.parametrize("module", ["dcp", "train"])
def test_train_v1_is_refused_at_import_saying_what_to_do(
    fresh: tuple[Path, dict[str, Finished]], module: str
) -> None:
    """Defect: with Train v1 selected, ``air_transfer.dcp`` failed deep inside with
    "cannot import name 'CheckpointUploadMode'"."""
    out = printed(fresh[1]["v1"])
    raised = dict(part.split("\n", 1) for part in out.split("--- ")[1:])[f"air_transfer.{module}"]
    assert "ImportError: air-transfer needs Ray Train v2" in raised, out
    assert "unset RAY_TRAIN_V2_ENABLED" in raised
