"""Transfer metrics read back the way a Ray user reads them: from the Prometheus
endpoint of the local Ray's metrics agent, sampled until they have moved by exactly
what a test expects."""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Callable
from typing import Any

import ray
from prometheus_client.parser import text_string_to_metric_families

from tests.support import shared_ray
from tests.support.procs import REPO_ROOT
from tests.support.waiting import eventually

#: The prefix of every air-transfer series.
P = "ray_air_transfer_"
Key = tuple[str, tuple[tuple[str, str], ...]]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_ray() -> str:
    """(Re)start the local Ray with a Prometheus endpoint its metrics agent exports
    to every 100 ms; the endpoint's URL."""
    shared_ray.release()

    def start() -> str:
        port = _free_port()
        ray.init(
            address="local",
            num_cpus=2,
            object_store_memory=512 * 1024 * 1024,
            include_dashboard=False,
            logging_level="ERROR",
            _metrics_export_port=port,
            _system_config={"metrics_report_interval_ms": 100},
            runtime_env={"env_vars": {"PYTHONPATH": REPO_ROOT}},
        )
        return f"http://127.0.0.1:{port}/metrics"

    return shared_ray.start_with_retries(start, ray.shutdown)


def scrape(url: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of every air-transfer series at ``url``."""
    try:
        text = urllib.request.urlopen(url, timeout=10).read().decode()
    except OSError:  # the agent is still starting
        return {}
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith(P):
                samples.setdefault(s.name, []).append((s.labels, s.value))
    return samples


def total(samples: dict[str, Any], name: str, **labels: str) -> float:
    """The sum over every series (process) of ``name`` with ``labels``."""
    return sum(
        value
        for series_labels, value in samples.get(P + name, [])
        if all(series_labels.get(k) == v for k, v in labels.items())
    )


def key(name: str, **labels: str) -> Key:
    return name, tuple(sorted(labels.items()))


def wait_for_counts(url: str, before: dict[str, Any], expected: dict[Key, float]) -> None:
    """Wait (30 s at most) until every ``(name, labels)`` has grown by exactly its
    expected amount since ``before``; fail naming what did not."""
    grown: dict[Key, float] = {}

    def as_expected() -> bool:
        now = scrape(url)
        grown.update(
            {
                k: total(now, k[0], **dict(k[1])) - total(before, k[0], **dict(k[1]))
                for k in expected
            }
        )
        return grown == expected

    eventually(as_expected, lambda: f"metrics to grow by {expected}: they grew by {grown}")


def baseline(url: str, ready: Callable[[dict[str, Any]], bool] = lambda s: True) -> dict[str, Any]:
    """The samples at ``url`` now, once ``ready`` holds for them (30 s at most)."""
    samples: dict[str, Any] = {}

    def got() -> bool:
        samples.clear()
        samples.update(scrape(url))
        return ready(samples)

    eventually(got, "a metrics endpoint")
    return samples
