"""The package as a user installs it: ``python -m build`` makes a wheel and an sdist
of this checkout, and each installs into a fresh virtual environment and imports
there, outside the checkout (so nothing is imported from the tree by accident).

A step of ``.ci/run`` rather than a test of the suite: it needs the package registry
(``build``'s isolated build environment, the wheel's dependencies resolved as a
user's pip resolves them) and a minute of installs, and it checks what is shipped,
not what the library does. The suite's ``tests/unit/test_packaging.py`` checks the
metadata it is built from.

    python .ci/check_dist.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
#: Shipped in both: the typing marker, the license and every subpackage.
SHIPPED = ["air_transfer/py.typed", "air_transfer/dcp/__init__.py", "air_transfer/extend.py"]
#: Not copied for the build: version control, caches, earlier builds, environments.
LEFT_OUT = [".git", "*.egg-info", "build", "dist", "__pycache__", ".*_cache", ".venv", "*.whl"]
#: What an installed copy must do, run by its interpreter from outside the checkout.
IMPORTS = textwrap.dedent(
    """
    import importlib.metadata as md, pathlib, sys
    import air_transfer, air_transfer.extend, air_transfer.train
    assert air_transfer.__version__ == sys.argv[1], (air_transfer.__version__, sys.argv[1])
    here = pathlib.Path(air_transfer.__file__)
    assert not here.is_relative_to(sys.argv[2]), here  # the installed copy, not the tree
    assert (here.parent / "py.typed").exists()
    try:
        import air_transfer.dcp
    except ImportError as e:  # no torch in this environment: the error says what to install
        assert "pip install '.[torch]'" in str(e) and "whl/cpu" in str(e), e
    else:
        raise AssertionError("air_transfer.dcp imported without torch installed")
    meta = md.metadata("air-transfer")
    assert meta["License-Expression"] == "Apache-2.0", meta["License-Expression"]
    ray = [r for r in meta.get_all("Requires-Dist") if r.startswith("ray[train]")]
    assert ray and "<2.61" in ray[0], ray
    print("imported", air_transfer.__version__, "from", air_transfer.__file__)
    """
)


def run(*cmd: str | Path, cwd: Path | None = None) -> None:
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.run([str(c) for c in cmd], check=True, cwd=cwd)


def venv(path: Path) -> Path:
    run(sys.executable, "-m", "venv", path)
    return path / "bin" / "python"


def check_contents(wheel: Path, sdist: Path, version: str) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    for name in SHIPPED:
        assert name in names, f"{wheel.name} lacks {name}"
    assert f"air_transfer-{version}.dist-info/licenses/LICENSE" in names or any(
        n.endswith(".dist-info/LICENSE") for n in names
    ), f"{wheel.name} lacks the LICENSE"
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))], names
    with tarfile.open(sdist) as tar:
        members = {m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name}
    for name in [*SHIPPED, "LICENSE", "pyproject.toml", "README.md"]:
        assert name in members, f"{sdist.name} lacks {name}"


def build(work: Path) -> tuple[Path, Path]:
    """The wheel and the sdist of this checkout, built in ``work`` (from a copy: the
    build writes its egg-info and build/ into the source tree), their contents
    checked."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    source = work / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(*LEFT_OUT))
    builder = venv(work / "build")
    run(builder, "-m", "pip", "install", "--quiet", "build")
    run(builder, "-m", "build", "--outdir", work / "dist", source)
    [wheel] = (work / "dist").glob("*.whl")
    [sdist] = (work / "dist").glob("*.tar.gz")
    check_contents(wheel, sdist, version)
    return wheel, sdist


def check_installed(python: Path, work: Path, sdist: Path | None = None) -> None:
    """What an installed copy must do, run by ``python`` (a fresh environment holding
    the wheel and its dependencies, no torch) from outside the checkout; then the
    same with the sdist installed over it, if given."""
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    script = work / "imports.py"
    script.write_text(IMPORTS)
    run(python, script, version, ROOT, cwd=work)
    if sdist is not None:
        run(python, "-m", "pip", "uninstall", "--quiet", "--yes", "air-transfer")
        run(python, "-m", "pip", "install", "--quiet", "--no-deps", sdist)
        run(python, script, version, ROOT, cwd=work)


def main() -> None:
    """Standalone (CI does the same within ``readme_commands.py others``, in the
    environment of the README's ``pip install air-transfer``)."""
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        wheel, sdist = build(work)
        user = venv(work / "user")
        run(user, "-m", "pip", "install", "--quiet", wheel)
        check_installed(user, work, sdist)
    print("dist ok: wheel and sdist install and import in a fresh environment")


if __name__ == "__main__":
    main()
