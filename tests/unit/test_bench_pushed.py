"""``bench --readers``' bytes pushed per node: Ray's ``ray_object_manager_bytes``
read from a Prometheus page by Type, differenced over a phase, and put as
multiples of the checkpoint per node (pushed from the store or from spilled
objects, and received)."""

from __future__ import annotations

from benchmarks.bench.pushed import delta, parse, pushed_ratios
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
