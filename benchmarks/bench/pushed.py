"""What Ray's object manager moved between nodes during a phase, per node: the
raylet's ``ray_object_manager_bytes`` counter by ``Type`` (``PushedFromLocalPlasma``,
``PushedFromLocalDisk``, ``Received``), read from each node's metrics endpoint
(``ray.nodes()``'s ``MetricsExportPort``), as a Ray user reads it. The raylet
reports every ``metrics_report_interval_ms`` (``REPORT_MS``, set for the run), so a
reading waits until two scrapes that far apart agree."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

import ray

METRIC = "ray_object_manager_bytes"
#: The raylets' metrics report interval of a run that reads these (its system config).
REPORT_MS = 500
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


def snapshot(
    urls: dict[str, str],
    settle_s: float = 30.0,
    changed_from: Bytes | None = None,
    scrape: Callable[[dict[str, str]], Bytes] = _scrape,
    interval_s: float = 1.5 * REPORT_MS / 1000,
) -> Bytes:
    """Every node's counters once they have settled: every node answered, two scrapes
    ``interval_s`` apart agree and, after a phase that moved bytes, differ from
    ``changed_from`` (the reading before it): two scrapes taken before any raylet
    reported the phase agree too, as do two of a cluster whose metrics agents are not
    up yet (a readers run once read 0 bytes moved). ``settle_s`` at most."""
    deadline = time.monotonic() + settle_s
    last = scrape(urls)
    while True:
        time.sleep(interval_s)
        now = scrape(urls)
        settled = now == last and len(now) == len(urls) and now != changed_from
        if settled or time.monotonic() > deadline:
            return now
        last = now


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
        pushed = types.get("PushedFromLocalPlasma", 0.0) + types.get("PushedFromLocalDisk", 0.0)
        out[names.get(node, node[:12])] = {
            "pushed": round(pushed / nbytes, 3),
            "received": round(types.get("Received", 0.0) / nbytes, 3),
        }
    return out
