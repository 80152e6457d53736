"""A run's storage made as the README makes it, before ``ray.init``: a bad setting
that needs the cluster to be seen (a root that is a file on the storage node, more
replicas than live nodes) is raised by ``Trainer.fit()`` as itself, before Train's
controller starts (it used to kill the controller: an ``ActorDiedError`` and a long
controller traceback); both through ``run_config()`` and through ``RunConfig``
made by hand. A fresh interpreter each: the storage must be made before Ray runs."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT, child_env

# A Ray of its own, started by fit() as a user's first fit() starts it.
pytestmark = pytest.mark.usefixtures("no_ray")

SCRIPT = """
import json, os, sys
import ray, ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer
import air_transfer

where = sys.argv[1]
a_file = os.path.join(where, "a-file")
with open(a_file, "w") as f:
    f.write("not a directory")
made = {  # each before ray.init, as the README makes its RunConfig
    "file root, run_config": air_transfer.run_config(root=a_file, name="run"),
    "file root, by hand": ray.train.RunConfig(
        storage_path=a_file, storage_filesystem=air_transfer.storage_filesystem(root=a_file)
    ),
    "under a file, run_config": air_transfer.run_config(root=a_file + "/runs"),
    "replicas, run_config": air_transfer.run_config(
        root=os.path.join(where, "replicated"), storage=air_transfer.StorageConfig(replicas=3)
    ),
    "replicas, by hand": ray.train.RunConfig(
        storage_path=os.path.join(where, "replicated"),
        storage_filesystem=air_transfer.storage_filesystem(
            root=os.path.join(where, "replicated"), replicas=3
        ),
    ),
}
assert not ray.is_initialized()
outcome = {}
for name, run_config in made.items():
    trainer = DataParallelTrainer(
        lambda: None, scaling_config=ray.train.ScalingConfig(num_workers=1), run_config=run_config
    )
    try:
        trainer.fit()
        outcome[name] = ["no error", ""]
    except Exception as e:
        outcome[name] = [type(e).__name__, str(e)]
print(json.dumps(outcome))
"""


def test_fit_raises_a_bad_storage_as_itself_before_trains_controller(tmp_path: Path) -> None:
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    # A short one: Ray's socket paths under it must fit a socket address (108 bytes).
    ray_tmp = tempfile.mkdtemp(prefix="entrance-ray-", dir="/tmp")
    try:
        done = subprocess.run(
            [sys.executable, str(script), str(tmp_path)],
            cwd=REPO_ROOT,
            env=child_env(RAY_TMPDIR=ray_tmp),
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    a_file = str(tmp_path / "a-file")
    for name in ("file root, run_config", "file root, by hand", "under a file, run_config"):
        kind, message = outcome[name]
        assert kind == "NotADirectoryError", (name, kind, message)
        assert f"{a_file!r} is a file" in message and "pass root= a directory" in message
    for name in ("replicas, run_config", "replicas, by hand"):
        kind, message = outcome[name]
        assert kind == "ValueError", (name, kind, message)
        assert "replicas=3 needs 3 distinct live nodes; this cluster has 1" in message
