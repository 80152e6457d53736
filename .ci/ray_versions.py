"""Every Ray minor version air-transfer supports but the newest (which the test suite
runs on: the test environment's pip picks it), each in a fresh virtual environment:
the private-API gate (``tests/unit/test_ray_internals.py``) and one Ray Train round
(``.ci/train_round.py``: DCP reports, a resume that loads and downloads, a plain
directory report read back), with no warning that the Ray is unsupported.

The range is ``air_transfer.core.ray_range``'s (``pyproject.toml`` pins the same); a
version is Ray's newest release of that minor on the index. Each environment holds
the package's dependencies with that Ray, pytest, and CI's CPU torch (installed once,
shared by a ``.pth`` file); the package itself runs from the checkout (on
``PYTHONPATH``, which Ray's workers inherit), so nothing is built here.

    python .ci/ray_versions.py           # every supported minor but the newest
    python .ci/ray_versions.py 2.59      # the ones named
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def _ray_range() -> tuple[tuple[int, int], tuple[int, int]]:
    """``core.ray_range``'s OLDEST and NEWEST, read from its file alone: importing it
    as part of the package would import the package's root, which needs Ray, and
    this runs in CI's own Python, without it."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "ray_range", ROOT / "air_transfer" / "core" / "ray_range.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OLDEST, module.NEWEST


OLDEST, NEWEST = _ray_range()

sys.path.insert(0, str(ROOT / ".ci"))
from readme_commands import TORCH_CPU  # noqa: E402  (beside this script)

#: The warning a supported Ray must not raise (``core.ray_range``).
UNSUPPORTED = "RayVersionWarning"


def minors() -> list[str]:
    """The supported minor versions but the newest, oldest first (``2.58``...)."""
    return [f"{OLDEST[0]}.{m}" for m in range(OLDEST[1], NEWEST[1])]


def run(cmd: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    print("+", " ".join(cmd), flush=True)
    return subprocess.run(cmd, check=True, text=True, **kwargs)  # type: ignore[call-overload]


def dependencies(minor: str) -> list[str]:
    """The package's requirements with Ray's replaced by the newest ``minor`` release."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = [d for d in project["dependencies"] if not re.match(r"ray\b", d)]
    return [f"ray[train]=={minor}.*", *deps, "pytest"]


def check(minor: str, torch_dir: Path, work: Path) -> None:
    started = time.monotonic()
    venv = work / f"ray-{minor}"
    run([sys.executable, "-m", "venv", str(venv)])
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", *dependencies(minor)])
    [site] = (venv / "lib").glob("python3*/site-packages")
    (site / "ci_torch.pth").write_text(f"{torch_dir}\n")
    installed = run(
        [python, "-c", "import ray, torch; print(ray.__version__, torch.__version__)"],
        capture_output=True,
    ).stdout.strip()
    print(f"  Ray and torch: {installed}", flush=True)
    assert installed.startswith(f"{minor}."), installed
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    gate = "tests/unit/test_ray_internals.py"
    run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", gate], cwd=ROOT, env=env)
    with tempfile.TemporaryDirectory(prefix="round-", dir="/tmp") as where:
        env["RAY_TMPDIR"] = str(Path(where) / "r")  # short: Ray's socket paths must fit
        # Ray Train's placement-group cleaner asks the State API whether the run's
        # controller lives; with another Ray on this machine (CI runs the README's
        # quick starts beside this) it could ask that one: point it at nothing.
        env["RAY_API_SERVER_ADDRESS"] = "http://127.0.0.1:9"
        done = run([python, str(ROOT / ".ci" / "train_round.py")], cwd=where, env=env,
                   capture_output=True, timeout=900)  # fmt: skip
    print(done.stdout.strip(), flush=True)
    assert UNSUPPORTED not in done.stderr, done.stderr[-3000:]
    print(f"  (Ray {minor}: {time.monotonic() - started:.0f} s)", flush=True)


def main() -> None:
    wanted = sys.argv[1:] or minors()
    with tempfile.TemporaryDirectory(prefix="ray-versions-") as tmp:
        work = Path(tmp)
        torch_dir = work / "torch"
        run([sys.executable, "-m", "pip", "install", "-q", "--target", str(torch_dir), TORCH_CPU])
        for minor in wanted:
            try:
                check(minor, torch_dir, work)
            except (subprocess.CalledProcessError, AssertionError) as e:
                output = getattr(e, "stderr", None) or ""
                sys.exit(f"Ray {minor} fails air-transfer's checks: {e}\n{output[-5000:]}")
    print(f"ray versions ok: {', '.join(wanted)} (and {NEWEST[0]}.{NEWEST[1]} by the suite)")


if __name__ == "__main__":
    main()
