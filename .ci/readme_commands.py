"""Every command the README shows a user, run as a newcomer would run it: each in a
fresh virtual environment holding only what that command's own install line installs,
so that a missing install step fails CI instead of hiding behind CI's own install.

The README's shell blocks (```bash) are the commands. Each is one command line of
steps joined by ``&&``; the steps that start with ``pip install`` are its install
line. ``pip install air-transfer[...]`` (what a user types for the released package)
installs the wheel ``python -m build`` makes of this checkout (``.ci/check_dist.py``:
its contents checked), and the environment of the plain ``pip install air-transfer``
then checks what an installed copy must do, with the wheel and then with the sdist
over it: the package as a user gets it.

    python .ci/readme_commands.py tests   # print the test command's steps (for .ci/run)
    python .ci/readme_commands.py others  # run every other command in a fresh venv

The test command is run by ``.ci/run`` itself, in the fresh environment the linters
use too. Every other command runs here at a small size (``SMALL``: the same command
with flags that shrink its work, never ones that skip a step), and a command that
names output files (``--json``, ``--plot``) must have written them; a JSON report's
every row must be measured and verified (or skipped, with its reason). Wherever an
extra whose torch is a range is installed (``[torch]``), a CPU build of torch is
installed first (as a PyTorch user has one: the range would download a multi-GB CUDA
build), and must still be there after the install; ``[test]`` pins that build itself,
so its line installs it alone. The bench's other
modes (``--dcp``, ``--train``, ...) are not README commands: the test suite runs them.

The install block (``git clone`` of this project's repository, ``cd`` into it, then
``pip install`` of the clone: CI runs in a fresh clone, so the first two are where it
already is) is followed, in its environment, by every Python block of the README,
each run unchanged as a script in an empty directory with a Ray of its own: the
quick starts as a newcomer meets them.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / ".ci"))
import check_dist  # noqa: E402  (beside this script)

#: Flags appended to a command that starts with the key, so that CI runs it small.
SMALL = {
    "python -m benchmarks bench": ["--sizes", "0.02", "--repeats", "1"],
    "python -m benchmarks demo": [],
}
#: What a torch extra's environment gets first.
TORCH_CPU = "torch==2.13.0"
#: The version ``TORCH_CPU`` installs, which no later install may replace.
TORCH_KEPT = "2.13.0+cpu"
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: The extras that bring torch.
TORCH_EXTRAS = sorted(
    name
    for name, reqs in PROJECT["optional-dependencies"].items()
    if any(re.match(r"torch\b", r) for r in reqs)
)
#: The extras that bring torch as a range (a user's own torch stays): CI installs the
#: CPU build first, as a PyTorch user has one.
TORCH_RANGE_EXTRAS = sorted(
    name
    for name, reqs in PROJECT["optional-dependencies"].items()
    if any(re.match(r"torch\b", r) and "==" not in r for r in reqs)
)
#: The project's repository, which the install block clones.
REPOSITORY = PROJECT["urls"]["Source"]


def blocks(readme: Path = ROOT / "README.md") -> list[list[list[str]]]:
    """The README's shell blocks: each a list of command lines (run in order, in one
    environment, as a user runs a block), each line its ``&&`` steps."""
    found = re.findall(r"^```(?:bash|sh)\n(.*?)^```", readme.read_text(), re.M | re.S)
    out = []
    for body in found:
        text = re.sub(r"\\\n\s*", " ", body).strip()
        # A line's comment (``  # what it installs``) is for the reader.
        uncommented = (re.sub(r"\s+#.*$", "", c).strip() for c in text.splitlines())
        lines = [c for c in uncommented if c and not c.startswith("#")]
        out.append([[s.strip() for s in line.split("&&")] for line in lines])
    return out


def commands() -> list[list[str]]:
    """Every command line of the README, in order."""
    return [line for block in blocks() for line in block]


def local(step: str, wheel: Path | None = None) -> str:
    """``pip install air-transfer[x]`` as the wheel of this checkout (``.[x]`` without
    one)."""
    where = str(wheel) if wheel is not None else "."
    return re.sub(r"""(['"]?)air-transfer(\[[^\]'"]*\])?\1""", rf"'{where}\2'", step)


def is_install(step: str) -> bool:
    return step.startswith("pip install") or step.startswith("python -m pip install")


def needs_torch(step: str, extras: list[str] = TORCH_EXTRAS) -> bool:
    """An install of one of ``extras`` (by default those that bring torch:
    ``[torch]``, ``[test]``)."""
    named = re.findall(r"\[([^\]]*)\]", step)
    return any(e.strip() in extras for group in named for e in group.split(","))


def is_where_ci_is(step: str) -> bool:
    """``git clone`` of this project's repository, or ``cd`` into its clone: where CI
    already runs (a fresh clone); any other clone or directory is a README error."""
    words = shlex.split(step)
    if words[:2] == ["git", "clone"]:
        if words[2:] != [REPOSITORY]:
            sys.exit(f"the README clones {words[2:]}, not the project ({REPOSITORY})")
        return True
    if words[:1] == ["cd"]:
        if words[1:] != [REPOSITORY.rsplit("/", 1)[1]]:
            sys.exit(f"the README changes to {words[1:]}, not the clone")
        return True
    return False


def split(command: list[str], wheel: Path | None = None) -> tuple[list[str], list[str]]:
    installs = [local(s, wheel) for s in command if is_install(s)]
    if any(needs_torch(s, TORCH_RANGE_EXTRAS) for s in installs):
        installs.insert(0, f"pip install -q {TORCH_CPU}")
    steps = [s for s in command if not is_install(s) and not is_where_ci_is(s)]
    return installs, steps


def test_command() -> list[str]:
    tests = [c for c in commands() if any("pytest" in s for s in c)]
    if len(tests) != 1:
        sys.exit(f"the README must show exactly one test command; found {len(tests)}")
    return tests[0]


def builds_in_checkout(step: str) -> bool:
    """An install of the checkout itself (``pip install -e '.[x]'``, ``pip install
    .``): setuptools writes its egg-info into the checkout."""
    checkout = r"""(^|\s)['"]?\.(\[[^\]]*\])?['"]?(\s|$)"""
    return is_install(step) and re.search(checkout, step) is not None


@contextlib.contextmanager
def checkout_lock(step: str) -> Iterator[None]:
    """Held while ``step`` builds in the checkout, when ``.ci/run`` runs these commands
    beside its own installs of the checkout (``CI_CHECKOUT_LOCK``: the file they all
    lock), so that no two builds write its egg-info at once."""
    lock = os.environ.get("CI_CHECKOUT_LOCK")
    if not lock or not builds_in_checkout(step):
        yield
        return
    with open(lock, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def run(step: str, env: dict[str, str]) -> None:
    print(f"+ {step}", flush=True)
    started = time.monotonic()
    with checkout_lock(step):
        subprocess.run(["bash", "-c", step], cwd=ROOT, env=env, check=True)
    print(f"  ({time.monotonic() - started:.0f} s)", flush=True)


def fresh_env(where: Path) -> dict[str, str]:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["VIRTUAL_ENV"] = str(where)
    env["PATH"] = f"{where / 'bin'}:{env.get('PATH', '')}"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def small(step: str) -> str:
    for prefix, flags in SMALL.items():
        if step.startswith(prefix):
            return f"{step} {shlex.join(flags)}" if flags else step
    return step


def check_outputs(step: str) -> None:
    words = shlex.split(step)
    for flag in ("--json", "--plot"):
        if flag in words:
            out = ROOT / words[words.index(flag) + 1]
            if not out.is_file() or out.stat().st_size == 0:
                sys.exit(f"{step!r} did not write {out}")
            if flag == "--json":
                check_report(step, json.loads(out.read_text()))
            out.unlink()


def check_report(step: str, report: dict[str, object]) -> None:
    """Every row of a bench's JSON report measured and verified, or skipped with its
    reason."""
    rows = report.get("results")
    if not isinstance(rows, list) or not rows:
        sys.exit(f"{step!r} wrote a report without results")
    for row in rows:
        status, verified = row.get("status"), row.get("verified")
        measured = status == "ok" and verified is not False
        if not measured and not (status == "skipped" and row.get("reason")):
            sys.exit(f"{step!r}: a row is not measured and verified: {row}")


def run_others() -> None:
    test = test_command()
    with tempfile.TemporaryDirectory(prefix="readme-dist-") as tmp:
        wheel, sdist = check_dist.build(Path(tmp))
        check_wheel(wheel, sdist, Path(tmp))
        for block in blocks():
            lines = [line for line in block if line != test]
            if not lines:
                continue
            with tempfile.TemporaryDirectory(prefix="readme-venv-") as venv_dir:
                env = fresh_env(Path(venv_dir) / "venv")
                python = Path(venv_dir) / "venv" / "bin" / "python"
                for line in lines:
                    run_line(line, env, python, wheel, sdist, Path(tmp))
                if any(is_where_ci_is(step) for line in lines for step in line):
                    run_quick_starts(env, python)


def run_line(
    line: list[str], env: dict[str, str], python: Path, wheel: Path, sdist: Path, work: Path
) -> None:
    installs, steps = split(line, wheel)
    for step in installs:
        run(step, env)
    if installs and not steps:  # an install line alone: what the installed copy does
        check_install(installs, python, work, sdist, wheel)
    for step in steps:
        run(small(step), env)
        check_outputs(step)


def run_quick_starts(env: dict[str, str], python: Path) -> None:
    """Every Python block of the README, unchanged, as a script in an empty directory
    with a Ray of its own (a short temp directory: its socket paths must fit)."""
    found = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    for i, block in enumerate(found):
        with tempfile.TemporaryDirectory(prefix="qs-", dir="/tmp") as where:
            script = Path(where) / f"quick_start_{i}.py"
            script.write_text(block)
            print(f"+ README's Python block {i + 1} of {len(found)}", flush=True)
            started = time.monotonic()
            ray_tmp = {"RAY_TMPDIR": str(Path(where) / "r")}
            subprocess.run([str(python), str(script)], cwd=where, env={**env, **ray_tmp},
                           check=True, timeout=900)  # fmt: skip
            print(f"  ({time.monotonic() - started:.0f} s)", flush=True)


def check_wheel(wheel: Path, sdist: Path, work: Path) -> None:
    """The package as a user installs it from git or an index (no torch): the wheel
    with its dependencies in a fresh environment, then the sdist over it."""
    with tempfile.TemporaryDirectory(prefix="readme-venv-") as venv_dir:
        env = fresh_env(Path(venv_dir) / "venv")
        run(f"pip install -q {wheel}", env)
        check_dist.check_installed(Path(venv_dir) / "venv" / "bin" / "python", work, sdist)


def check_install(installs: list[str], python: Path, work: Path, sdist: Path, wheel: Path) -> None:
    """The package a user installed: with torch, its DCP integration imports and the
    torch installed before is still there; without, what ``check_dist`` checks of an
    installed copy (wheel, then sdist over it)."""
    if any(needs_torch(step) for step in installs):
        code = (
            "import torch, air_transfer, air_transfer.dcp\n"
            f"assert torch.__version__ == {TORCH_KEPT!r}, ('torch replaced', torch.__version__)\n"
            "print('dcp ok, torch', torch.__version__)"
        )
        subprocess.run([str(python), "-c", code], cwd=work, check=True)
    else:
        check_dist.check_installed(python, work, sdist)
        # The sdist stays installed (no dependencies of its own): the wheel again.
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--force-reinstall",
                        "--no-deps", str(wheel)], check=True)  # fmt: skip


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "tests":
        installs, steps = split(test_command())
        print(" && ".join([*installs, *steps]))
    elif what == "test-install":
        print(" && ".join(split(test_command())[0]))
    elif what == "test-run":
        print(" && ".join(split(test_command())[1]))
    elif what == "others":
        run_others()
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
