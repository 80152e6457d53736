"""``benchmarks.bench.cpu``: CPU seconds per process role between two snapshots."""

from __future__ import annotations

import os

from benchmarks.bench.cpu import snapshot, spent


def test_spent_sums_each_role_and_counts_new_processes_from_zero() -> None:
    before = {1: ("agent", 1.0), 2: ("other", 0.5), 3: ("other", 2.0)}
    after = {1: ("agent", 1.25), 2: ("other", 0.75), 3: ("other", 2.5), 4: ("raylet", 0.1)}
    assert spent(before, after) == {"agent": 0.25, "other": 0.75, "raylet": 0.1, "total": 1.1}


def test_snapshot_names_this_process_by_its_role_or_as_the_driver() -> None:
    assert snapshot({})[os.getpid()][0] == "driver"
    role, seconds = snapshot({"consumer": os.getpid()})[os.getpid()]
    assert role == "consumer" and seconds > 0


def test_a_snapshot_from_another_process_of_the_session_names_the_root_the_driver() -> None:
    """A Train rank snapshots the driver's tree (``bench --dcp``): the root is the
    driver, wherever the snapshot is taken."""
    parent = os.getppid()
    found = snapshot({"rank 0": os.getpid()}, root=parent)
    assert found[parent][0] == "driver"
    assert found[os.getpid()][0] == "rank 0"
