"""What Ray's object manager moved between nodes during a phase, per node: the
raylet's ``ray_object_manager_bytes`` counter by ``Type`` (``PushedFromLocalPlasma``,
``PushedFromLocalDisk``, ``Received``), read from each node's metrics endpoint
(``ray.nodes()``'s ``MetricsExportPort``), as a Ray user reads it. The raylet
records the counter every half ``metrics_report_interval_ms`` (``REPORT_MS``, set
for the run) and exports it to its node's agent at most once a second (Ray floors
the export interval at 1 s), so a reading waits until two scrapes further apart
than one export agree."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

import ray

METRIC = "ray_object_manager_bytes"
#: The raylets' metrics report interval of a run that reads these (its system config).
REPORT_MS = 500
#: Seconds between two exports of a raylet's metrics: ``max(REPORT_MS, 1000)`` ms (the
#: floor Ray's ``stats.h`` sets, mirrored in its ``open_telemetry_metric_recorder``).
EXPORT_S = max(REPORT_MS, 1000) / 1000
#: How far the cluster's bytes pushed and bytes received may differ in a settled reading.
BALANCE = 0.01
#: node id -> Type -> bytes
Bytes = dict[str, dict[str, float]]


def parse(text: str) -> dict[str, float]:
    """``Type -> bytes`` of ``METRIC`` in a Prometheus text page (summed per Type)."""
    text_string_to_metric_families = prometheus_parser()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == METRIC and "Type" in s.labels:
                out[s.labels["Type"]] = out.get(s.labels["Type"], 0.0) + s.value
    return out


def prometheus_parser() -> Any:
    """``prometheus_client``'s page parser; it comes with Ray's metrics agent
    (``ray[default]``), which ``--readers`` needs to read the raylets' counters."""
    try:
        from prometheus_client.parser import text_string_to_metric_families
    except ImportError as e:
        raise SystemExit(
            "bench --readers reads the bytes each raylet moved from Ray's metrics agent: "
            "pip install 'ray[default]==2.60.*' (it brings prometheus_client)"
        ) from e
    return text_string_to_metric_families


def endpoints() -> dict[str, str]:
    """node id -> its metrics URL, for every live node."""
    return {
        n["NodeID"]: f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
        for n in ray.nodes()
        if n.get("Alive") and n.get("MetricsExportPort")
    }


def _scrape(urls: dict[str, str]) -> Bytes:
    """The counters of every node that answered (a node whose metrics agent is not up
    yet is left out, not read as zero)."""
    out: Bytes = {}
    for node, url in urls.items():
        try:
            out[node] = parse(urllib.request.urlopen(url, timeout=10).read().decode())
        except OSError:
            continue
    return out


def balanced(reading: Bytes) -> bool:
    """Every byte a raylet received another pushed: the cluster's totals agree
    (within ``BALANCE``) once every raylet has reported, and differ while the
    receiver's counter is exported and the sender's is not yet."""
    pushed = sum(pushed_from(t) for t in reading.values())
    received = sum(t.get("Received", 0.0) for t in reading.values())
    return abs(pushed - received) <= BALANCE * max(pushed, received)


def snapshot(
    urls: dict[str, str],
    settle_s: float = 30.0,
    changed_from: Bytes | None = None,
    scrape: Callable[[dict[str, str]], Bytes] = _scrape,
    interval_s: float = 1.5 * EXPORT_S,
) -> Bytes:
    """Every node's counters once they have settled: every node answered, two scrapes
    ``interval_s`` apart agree, the bytes pushed balance the bytes received and,
    after a phase that moved bytes, the reading differs from ``changed_from`` (the
    one before it): two scrapes taken before any raylet reported the phase agree
    too, as do two of a cluster whose metrics agents are not up yet (a readers run
    once read 0 bytes moved), or two taken after the receiver reported and before
    the sender did (one read 0 bytes pushed). ``settle_s`` at most."""
    deadline = time.monotonic() + settle_s
    last = scrape(urls)
    while True:
        time.sleep(interval_s)
        now = scrape(urls)
        settled = now == last and len(now) == len(urls) and now != changed_from and balanced(now)
        if settled or time.monotonic() > deadline:
            return now
        last = now


def pushed_from(types: dict[str, float]) -> float:
    """Bytes one node's raylet pushed, from its object store or from spilled objects."""
    return types.get("PushedFromLocalPlasma", 0.0) + types.get("PushedFromLocalDisk", 0.0)


def delta(before: Bytes, after: Bytes) -> Bytes:
    return {
        node: {t: v - before.get(node, {}).get(t, 0.0) for t, v in types.items()}
        for node, types in after.items()
    }


def pushed_ratios(moved: Bytes, nbytes: int, names: dict[str, str]) -> dict[str, Any]:
    """Per node (by its name in ``names``): bytes pushed (from its store or spilled)
    and received, as multiples of the checkpoint."""
    out: dict[str, Any] = {}
    for node, types in sorted(moved.items(), key=lambda kv: names.get(kv[0], kv[0])):
        out[names.get(node, node[:12])] = {
            "pushed": round(pushed_from(types) / nbytes, 3),
            "received": round(types.get("Received", 0.0) / nbytes, 3),
        }
    return out
