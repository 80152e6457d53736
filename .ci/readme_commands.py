"""Every command the README shows a user, run as a newcomer would run it: each in a
fresh virtual environment holding only what that command's own install line installs,
so that a missing install step fails CI instead of hiding behind CI's own install.

The README's shell blocks (```bash) are the commands. Each is one command line of
steps joined by ``&&``; the steps that start with ``pip install`` are its install
line. ``pip install air-transfer[...]`` (what a user types for the released package)
installs this checkout instead (``.[...]``): CI tests the tree it is given.

    python .ci/readme_commands.py tests   # print the test command's steps (for .ci/run)
    python .ci/readme_commands.py others  # run every other command in a fresh venv

The test command is run by ``.ci/run`` itself, in the fresh environment the linters
use too. Every other command runs here at a small size (``SMALL``: the same command
with flags that shrink its work, never ones that skip a step), and a command that
names output files (``--json``, ``--plot``) must have written them. The main job is
also run with ``--dcp`` after the README's torch install line is added to its
environment, over a CPU build of torch installed first (as a PyTorch user has one:
an unpinned torch would download a multi-GB CUDA build).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Flags appended to a command that starts with the key, so that CI runs it small.
SMALL = {
    "python -m benchmarks bench": ["--sizes", "0.02", "--repeats", "1"],
    "python -m benchmarks demo": [],
}
#: The DCP variant of the main job, and what its environment gets first.
DCP_FLAGS = ["--dcp", "--dcp-mib", "4", "--repeats", "1"]
TORCH_CPU = "torch==2.13.0"
TORCH_EXTRA = "pip install -e '.[torch]'"


def blocks(readme: Path = ROOT / "README.md") -> list[list[str]]:
    """The README's shell commands, each as its ``&&`` steps."""
    found = re.findall(r"^```(?:bash|sh)\n(.*?)^```", readme.read_text(), re.M | re.S)
    commands = []
    for body in found:
        line = re.sub(r"\\\n\s*", " ", body).strip()
        for command in filter(None, (c.strip() for c in line.splitlines())):
            if command.startswith("#"):
                continue
            commands.append([s.strip() for s in command.split("&&")])
    return commands


def local(step: str) -> str:
    """``pip install air-transfer[x]`` as this checkout (``.[x]``)."""
    return re.sub(r"""(['"]?)air-transfer(\[[^\]'"]*\])?\1""", r"'.\2'", step)


def is_install(step: str) -> bool:
    return step.startswith("pip install") or step.startswith("python -m pip install")


def split(command: list[str]) -> tuple[list[str], list[str]]:
    installs = [local(s) for s in command if is_install(s)]
    return installs, [s for s in command if not is_install(s)]


def test_command() -> list[str]:
    tests = [c for c in blocks() if any("pytest" in s for s in c)]
    if len(tests) != 1:
        sys.exit(f"the README must show exactly one test command; found {len(tests)}")
    return tests[0]


def run(step: str, env: dict[str, str]) -> None:
    print(f"+ {step}", flush=True)
    started = time.monotonic()
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
            out.unlink()


def run_others() -> None:
    test = test_command()
    others = [c for c in blocks() if c != test]
    for command in others:
        installs, steps = split(command)
        with tempfile.TemporaryDirectory(prefix="readme-venv-") as tmp:
            env = fresh_env(Path(tmp) / "venv")
            for step in installs:
                run(step, env)
            for step in steps:
                run(small(step), env)
                check_outputs(step)
                if step.startswith("python -m benchmarks bench"):
                    run(f"pip install -q {TORCH_CPU}", env)
                    run(TORCH_EXTRA, env)
                    run(f"{step} {shlex.join(DCP_FLAGS)}", env)
                    check_outputs(step)


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
