"""``bench --readers``' bytes pushed per node: Ray's ``ray_object_manager_bytes``
read from a Prometheus page by Type, differenced over a phase, and put as
multiples of the checkpoint per node (pushed from the store or from spilled
objects, and received)."""

from __future__ import annotations

from benchmarks.bench.pushed import Bytes, delta, parse, pushed_ratios, snapshot
from benchmarks.bench.report import pushed_text

PAGE = """# HELP ray_object_manager_bytes Number of bytes pushed or received by type.
# TYPE ray_object_manager_bytes gauge
ray_object_manager_bytes{Component="raylet",Type="PushedFromLocalPlasma",WorkerId=""} 300.0
ray_object_manager_bytes{Component="raylet",Type="PushedFromLocalDisk",WorkerId=""} 50.0
ray_object_manager_bytes{Component="raylet",Type="Received",WorkerId=""} 10.0
ray_object_store_memory{Location="MMAP_SHM"} 999.0
"""


def test_bytes_pushed_per_node_as_multiples_of_the_checkpoint() -> None:
    after = {"n1": parse(PAGE), "n2": {"Received": 400.0}}
    assert after["n1"] == {
        "PushedFromLocalPlasma": 300.0,
        "PushedFromLocalDisk": 50.0,
        "Received": 10.0,
    }
    before = {"n1": {"PushedFromLocalPlasma": 100.0}, "n2": {}}
    moved = delta(before, after)
    ratios = pushed_ratios(moved, 100, {"n1": "node_a", "n2": "reader_1"})
    assert ratios == {
        "node_a": {"pushed": 2.5, "received": 0.1},
        "reader_1": {"pushed": 0.0, "received": 4.0},
    }
    assert pushed_text(ratios) == "node_a:2.50"


def test_a_reading_after_a_phase_waits_for_the_raylets_to_report_it() -> None:
    """Two scrapes taken before any raylet reported the phase agree: the reading after
    it waits until it differs from the one before, then until it is stable; a phase
    that moved nothing returns once ``settle_s`` is spent."""

    def moved(n: float) -> Bytes:
        return {"n1": {"Received": n}, "n2": {"PushedFromLocalPlasma": n}}

    before = moved(0.0)
    pages = iter([before, before, before, moved(5.0), moved(9.0)])
    last = moved(9.0)

    def scrape(urls: dict[str, str]) -> Bytes:
        return next(pages, last)

    two = {"n1": "u1", "n2": "u2"}
    assert snapshot(two, 30, before, scrape, interval_s=0) == last
    assert snapshot(two, 0, before, lambda urls: before, interval_s=0) == before
    assert snapshot(two, 30, None, lambda urls: before, interval_s=0) == before


def test_a_reading_waits_for_every_nodes_metrics_agent() -> None:
    """A node whose metrics agent does not answer yet is missing from a scrape, not
    read as zero: the reading waits until every node answers."""
    urls = {"n1": "u1", "n2": "u2"}
    whole = {"n1": {"Received": 1.0}, "n2": {"PushedFromLocalDisk": 1.0}}
    pages = iter([{"n1": {"Received": 1.0}}] * 3)

    def scrape(urls: dict[str, str]) -> Bytes:
        return next(pages, whole)

    assert snapshot(urls, 30, None, scrape, interval_s=0) == whole


def test_a_reading_waits_for_the_sender_to_report_what_the_receiver_did() -> None:
    """The receiver's raylet may report a phase before the sender's: two scrapes with
    the bytes received and none pushed agree, and the reading waits until the bytes
    pushed balance them."""
    urls = {"sender": "u1", "reader": "u2"}
    before = {"sender": {"PushedFromLocalPlasma": 0.0}, "reader": {"Received": 0.0}}
    half = {"sender": {"PushedFromLocalPlasma": 0.0}, "reader": {"Received": 200.0}}
    whole = {"sender": {"PushedFromLocalPlasma": 150.0, "PushedFromLocalDisk": 50.0},
             "reader": {"Received": 200.0}}  # fmt: skip
    pages = iter([half] * 4)

    def scrape(urls: dict[str, str]) -> Bytes:
        return next(pages, whole)

    assert snapshot(urls, 30, before, scrape, interval_s=0) == whole
    assert snapshot(urls, 0, before, lambda urls: half, interval_s=0) == half
