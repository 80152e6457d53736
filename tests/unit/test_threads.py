"""Background threads: every one is started by ``core.threads`` (a named daemon); the
periodic helper ticks while its owner lives and stops at the process's exit, before
the interpreter is torn down. Plain Python, no Ray."""

from __future__ import annotations

import ast
import gc
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from air_transfer.core.threads import Periodic, pool, start_daemon
from tests.support.procs import REPO_ROOT, child_env

PACKAGE = Path(REPO_ROOT) / "air_transfer"
#: The one module that makes threads.
HELPER = PACKAGE / "core" / "threads.py"


def thread_constructions(source: str) -> list[int]:
    """Lines of ``source`` that construct a ``threading.Thread`` or a
    ``ThreadPoolExecutor``."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("Thread", "ThreadPoolExecutor"):
                lines.append(node.lineno)
    return lines


def test_threads_are_started_only_by_the_helper() -> None:
    offenders = {
        str(path.relative_to(PACKAGE.parent)): lines
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != HELPER and (lines := thread_constructions(path.read_text()))
    }
    assert offenders == {}, f"start threads with core.threads (start_daemon, pool): {offenders}"
    assert thread_constructions(HELPER.read_text()), "the scan finds a construction"


def test_start_daemon_names_a_daemon_and_passes_arguments() -> None:
    got: list[tuple[str, bool, int, str]] = []

    def run(a: int, *, b: str) -> None:
        me = threading.current_thread()
        got.append((me.name, me.daemon, a, b))

    start_daemon("air-transfer-test", run, 1, b="x").join(5)
    assert got == [("air-transfer-test", True, 1, "x")]


def test_a_thread_not_named_for_the_library_is_refused() -> None:
    with pytest.raises(ValueError, match="air-transfer"):
        start_daemon("worker", lambda: None)
    with pytest.raises(ValueError, match="air-transfer"):
        pool("worker", 1)


def test_a_pool_names_its_threads_and_runs_their_initializer() -> None:
    started = []
    with pool("air-transfer-test-pool", 2, lambda: started.append(1)) as threads:
        names = list(threads.map(lambda _: threading.current_thread().name, range(4)))
    assert names and all(n.startswith("air-transfer-test-pool_") for n in names)
    assert started and len(started) <= 2


def test_periodic_starts_once_and_ticks_every_period() -> None:
    ticks = threading.Semaphore(0)
    periods = []

    def period() -> float:
        periods.append(1)
        return 0.01

    periodic = Periodic("air-transfer-test-periodic", period, ticks.release)
    before = set(threading.enumerate())
    periodic.start()
    periodic.start()
    started = [t for t in threading.enumerate() if t not in before]
    assert [t.name for t in started] == ["air-transfer-test-periodic"]
    assert started[0].daemon
    for _ in range(3):
        assert ticks.acquire(timeout=5)
    assert len(periods) >= 3  # the period is read before each wait


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_periodic_ends_on_an_error_of_its_tick() -> None:
    calls = []

    def tick() -> None:
        calls.append(1)
        raise RuntimeError("boom")

    periodic = Periodic("air-transfer-test-failing", lambda: 0.01, tick)
    periodic.start()
    deadline = time.monotonic() + 5
    while not calls and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.1)
    assert calls == [1]


def test_an_idle_periodic_ends_and_the_next_start_starts_it_again() -> None:
    """A watcher with nothing left to watch ends; work added later starts it anew."""
    work: list[int] = []
    lock, ticked = threading.Lock(), threading.Semaphore(0)

    def tick() -> None:
        with lock:
            work.clear()
        ticked.release()

    def idle() -> bool:
        with lock:
            return not work

    periodic = Periodic("air-transfer-test-idle", lambda: 0.01, tick, idle)
    threads = []
    for _ in range(2):
        work.append(1)
        periodic.start()
        threads.append(periodic._thread)
        assert ticked.acquire(timeout=5)
        thread = threads[-1]
        assert thread is not None
        thread.join(5)
        assert not thread.is_alive()
    assert threads[0] is not threads[1]


def test_a_stopped_periodic_ticks_no_more_and_starts_no_more() -> None:
    ticks: list[int] = []
    ticked = threading.Event()

    def tick() -> None:
        ticks.append(1)
        ticked.set()

    periodic = Periodic("air-transfer-test-stopped", lambda: 0.01, tick)
    periodic.start()
    assert ticked.wait(5)
    thread = periodic._thread
    assert thread is not None
    periodic.stop()
    thread.join(5)
    assert not thread.is_alive()
    count = len(ticks)
    periodic.start()
    assert periodic._thread is thread and len(ticks) == count


class _Owner:
    def __init__(self) -> None:
        self.ticked = threading.Event()

    def tick(self) -> None:
        self.ticked.set()


def test_a_periodic_method_does_not_keep_its_object_and_ends_with_it() -> None:
    owner = _Owner()
    periodic = Periodic("air-transfer-test-owned", lambda: 0.01, owner.tick)
    periodic.start()
    assert owner.ticked.wait(5)
    thread = periodic._thread
    assert thread is not None and thread.is_alive()
    del owner
    gc.collect()
    thread.join(5)
    assert not thread.is_alive(), "the thread outlived the object whose method it ran"


def test_threads_that_wake_stop_at_exit_before_earlier_exit_handlers() -> None:
    """Ray and pyarrow register their exit handlers when imported (before any of
    ours): a periodic thread, or a loop waiting on ``exiting``, must have stopped
    before those run."""
    script = textwrap.dedent(
        """
        import atexit, threading
        from air_transfer.core.threads import Periodic, exiting, start_daemon, stop_at_exit

        ticked = threading.Event()
        def earlier_handler():
            alive = [t.name for t in threading.enumerate() if t.name.startswith("air-transfer")]
            print("alive at the earlier exit handler:", alive, flush=True)
        atexit.register(earlier_handler)
        Periodic("air-transfer-test-exit", lambda: 0.001, ticked.set).start()
        assert ticked.wait(5)
        def loop():
            while not exiting(0.001):
                pass
        stop_at_exit(start_daemon("air-transfer-test-loop", loop))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "alive at the earlier exit handler: []" in done.stdout, done.stdout
