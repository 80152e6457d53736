"""The test process's exit (``tests.support.process_exit``): pytest's status kept,
Python's exit handlers run, the interpreter's teardown skipped. Each case is a pytest
of its own over a module that fails one test and marks what ran at exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.procs import REPO_ROOT, child_env

MODULE = '''
import atexit, os

def _mark(path):
    os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))

atexit.register(_mark, {handler!r})

class _Finalized:
    """Destroyed with this module, in the interpreter's teardown."""
    def __init__(self, path):
        self.mark, self.path = _mark, path
    def __del__(self):
        self.mark(self.path)

_held = _Finalized({teardown!r})

def test_passes():
    pass

def test_fails():
    assert False, "fails on purpose"
'''


#: A program that runs pytest in its own process and goes on after it.
CALLER = "import pytest, sys; print('after', int(pytest.main(sys.argv[1:])))"


def _pytest(tmp: Path, *plugin: str, caller: bool = False) -> subprocess.Popen[str]:
    tmp.mkdir()
    module = tmp / "test_exits.py"
    module.write_text(MODULE.format(handler=str(tmp / "handler"), teardown=str(tmp / "teardown")))
    program = ["-c", CALLER] if caller else ["-m", "pytest"]
    return subprocess.Popen(
        [sys.executable, *program, "-q", "-p", "no:cacheprovider",
         "-p", "no:hypothesispytest", *plugin, str(module)],
        cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip


def test_the_exit_keeps_the_status_and_the_handlers_and_skips_the_teardown(tmp_path: Path) -> None:
    plain = _pytest(tmp_path / "plain")
    ours = _pytest(tmp_path / "ours", "-p", "tests.support.process_exit")
    for run in (plain, ours):
        out, _ = run.communicate(timeout=120)
        assert run.returncode == 1, out
        assert "1 failed, 1 passed" in out, out
    # Without the plugin the module's object is destroyed in the teardown: the
    # check below would see that.
    assert (tmp_path / "plain" / "handler").exists()
    assert (tmp_path / "plain" / "teardown").exists()
    assert (tmp_path / "ours" / "handler").exists()
    assert not (tmp_path / "ours" / "teardown").exists()


def test_a_program_calling_pytest_main_goes_on_after_it(tmp_path: Path) -> None:
    run = _pytest(tmp_path / "caller", "-p", "tests.support.process_exit", caller=True)
    out, _ = run.communicate(timeout=120)
    assert run.returncode == 0, out
    assert "1 failed, 1 passed" in out and "after 1" in out, out
    assert (tmp_path / "caller" / "teardown").exists()  # its interpreter ended as usual
