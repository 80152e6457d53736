"""The test process ends right after Python's exit handlers, with pytest's exit status,
skipping the interpreter's and the native libraries' teardown (``os._exit``).

Why: Ray leaves native threads running after ``ray.shutdown()``: its metrics threads
(opencensus' harvester, OpenTelemetry's exporter) are never stopped, by design, so that
a later ``ray.init()`` can use them again, and every start of Ray leaves gRPC polling
threads (35 after the suite's 17 starts). They wake on their own while the process's
C++ static objects are destroyed, after Python's fault handler is gone: twice the
suite's CI run printed "1138 passed" and died with SIGSEGV and no stack. Everything of
Python's (``atexit`` handlers: Ray's shutdown, pyarrow's S3 finalizer, the library's
thread stopper; logging's flush) still runs first, with the fault handler on, so a
crash there still shows, and a failed run still exits non-zero.

A pytest plugin (``tests/conftest.py`` registers it). Only where pytest is the
program (``pytest``, ``python -m pytest``): a program that calls ``pytest.main()``
goes on after it; and not in pytest-xdist's workers, whose exit their controller
waits on.
"""

from __future__ import annotations

import atexit
import os
import sys
from pathlib import Path

import pytest

_session = pytest.StashKey[pytest.Session]()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_session] = session


def _pytest_is_the_program() -> bool:
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:  # python -m pytest
        return spec.name in ("pytest", "pytest.__main__")
    return Path(getattr(main, "__file__", None) or "").name in ("pytest", "py.test")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """After every other plugin's unconfigure: run the exit handlers, flush, leave."""
    if hasattr(config, "workerinput") or _session not in config.stash:
        return
    if not _pytest_is_the_program():  # pytest.main() called by a program that goes on
        return
    status = int(config.stash[_session].exitstatus)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)
