"""Fixtures for every tier: one local Ray per test module (``ray_local``), the
strategy registry restored after a test, and the test-only strategy registered so
that every contract test runs over it as well."""

from __future__ import annotations

import gc
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import ray.cloudpickle

from air_transfer.core import proven_read
from air_transfer.extend import register_strategy
from air_transfer.transfer.strategies import registry
from tests.support import process_exit, shared_ray, strategies_for_tests
from tests.support.procs import REPO_ROOT

# Ray Train's controller polls its workers every 2 s, and a run ends (and a report
# made right after another returns) only at a poll: poll every 0.2 s in the tests'
# Train runs. Set before any Ray starts here, so every Ray process (and every child
# process: the bench's and the demo's) inherits it.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
# Each Train run starts a preemption watcher actor (a process, ~1.5 s of CPU) that
# waits for a cloud's preemption notice; no test's node is preempted that way.
os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")

# Where the suite runs in parallel processes (pytest-xdist's ``-n``), each gets a
# Ray temp directory of its own, where Ray keeps its sockets, its sessions and the
# address a plain ``ray.init()`` would attach to, so that one process's Ray (a mock
# cluster, a bench subprocess's) never meets another's.
if _worker := os.environ.get("PYTEST_XDIST_WORKER"):
    _ray_tmp = os.path.join(os.environ.get("RAY_TMPDIR", tempfile.gettempdir()), f"ray-{_worker}")
    os.makedirs(_ray_tmp, exist_ok=True)
    os.environ["RAY_TMPDIR"] = _ray_tmp

# Ray Train's placement-group cleaner asks the State API (the dashboard's HTTP server)
# every second whether the run's controller lives, and removes the run's placement
# group, killing its workers, when the answer does not list it: with two Ray instances
# on one machine, or a GCS slow to answer, a live controller was once taken for dead.
# The tests' clusters run no dashboard; point the State API at nothing, so that the
# cleaner's query fails and it keeps watching, as it does where no dashboard is.
os.environ.setdefault("RAY_API_SERVER_ADDRESS", "http://127.0.0.1:9")

# Workers unpickle the strategy stored in a transfer handle: ship its code by value
# rather than relying on the tests package being importable there.
ray.cloudpickle.register_pickle_by_value(strategies_for_tests)
register_strategy(strategies_for_tests.BytesChunksStrategy)


TIERS = ("unit", "ray", "cluster", "e2e")


def pytest_configure(config: pytest.Config) -> None:
    """The process ends after Python's exit handlers, without the native teardown that
    Ray's leftover threads crash (``tests.support.process_exit``)."""
    config.pluginmanager.register(process_exit, "air-transfer-process-exit")


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to run while a test module lies outside the tiers: the README's command
    names the tier folders, so such a module would silently never run."""
    here = Path(__file__).parent
    stray = [p for p in here.glob("*/**/test_*.py") if p.relative_to(here).parts[0] not in TIERS]
    stray += [*here.glob("test_*.py"), *Path(REPO_ROOT, "integration_tests").glob("test_*.py")]
    if stray:
        names = ", ".join(sorted(str(p.relative_to(REPO_ROOT)) for p in stray))
        raise pytest.UsageError(
            f"test modules outside the tiers tests/{{{','.join(TIERS)}}}: {names}"
        )


#: The order, within each tier, of the modules by the Ray they use: ``own`` (a
#: module that starts one of its own: marked ``own_ray``, or asks for ``no_ray``),
#: the shared ``local`` one, the shared ``cluster``, or ``none`` seen (a module that
#: asks at run time sits where the shared local Ray is already up). Grouped, the
#: shared Ray is started once per group instead of again after every module that
#: stopped it; the cluster tier ends and the end-to-end tier begins on the shared
#: cluster, so it carries over. Modules keep their order inside a group, tests theirs.
RAY_ORDER = {
    "unit": ("none",),
    "ray": ("own", "local", "none"),
    "cluster": ("own", "none", "local", "cluster"),
    "e2e": ("cluster", "none", "local", "own"),
}


def _ray_used(item: pytest.Item) -> str:
    if item.get_closest_marker("own_ray") is not None or "no_ray" in item.fixturenames:
        return "own"
    if "ray_local" in item.fixturenames:
        return "local"
    return "cluster" if "cluster" in item.fixturenames else "none"


def pytest_collection_finish(session: pytest.Session) -> None:
    """Move everything alive once the tests are collected (Ray, torch, pyarrow and
    every test module: ~360,000 objects) out of the garbage collector's sight
    (``gc.freeze``): the suite collects garbage hundreds of times, to release refs
    held in reference cycles before it checks that Ray freed them, and each full
    collection took ~0.12-0.16 s scanning those objects; it now scans only what the
    tests made. botocore's S3 and IAM models, loaded at a module's first S3 client,
    are loaded first where S3 tests were collected, so that they are frozen too."""
    if "tests.support.s3" in sys.modules:
        from tests.support import s3

        s3.load_models()
    gc.freeze()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run each tier's modules grouped by the Ray they use (``RAY_ORDER``); a
    module's group is that of the first of its tests that uses one."""
    here = Path(__file__).parent
    group: dict[Path, str] = {}
    for item in items:
        used = _ray_used(item)
        if group.get(item.path, "none") == "none":
            group[item.path] = used

    def key(item: pytest.Item) -> tuple[int, int]:
        tier = item.path.relative_to(here).parts[0]
        order = RAY_ORDER.get(tier, ("none",))
        rank = order.index(group[item.path]) if group[item.path] in order else 0
        return (TIERS.index(tier) if tier in TIERS else len(TIERS), rank)

    items.sort(key=key)


@pytest.fixture(scope="module")
def ray_local() -> None:
    """The local Ray the suite shares (``tests.support.shared_ray``): started at the
    first module that asks, kept for the next (starting Ray costs seconds)."""
    shared_ray.local()


@pytest.fixture(scope="module")
def no_ray() -> None:
    """For a module whose tests start a Ray of their own (a bench or example
    subprocess, ``main()`` starting a cluster): the shared one stopped first."""
    shared_ray.release()


@pytest.fixture(scope="session", autouse=True)
def shared_ray_released() -> Iterator[None]:
    """Whatever Ray the modules shared is stopped when the session ends."""
    yield
    shared_ray.release()


@pytest.fixture
def registry_restored() -> Iterator[None]:
    """The strategy registry and its size rules as they were before the test (there
    is no unregistering in the public API, as in fsspec's): a test may register
    strategies and size rules without leaking them into later tests."""
    classes, rules = dict(registry._registry), dict(registry._size_rules)
    yield
    registry._registry.clear()
    registry._registry.update(classes)
    registry._size_rules.clear()
    registry._size_rules.update(rules)


@pytest.fixture
def in_driver(monkeypatch: pytest.MonkeyPatch) -> Callable[[Any], None]:
    """Install a packing hook (``proven_read._after_span_read``, see
    ``tests.support.rewriters``) in this process, undone after the test."""
    return lambda hook: monkeypatch.setattr(proven_read, "_after_span_read", hook)
