"""``bench --scale``'s arithmetic and choices, without a cluster: which placements
are measured, the bytes under a node's root, a node's and a run's figures in shards
from Ray's counters, and the table."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from benchmarks.__main__ import main
from benchmarks.bench.pushed import Bytes
from benchmarks.bench.scale_path import disk_bytes, own_shard_files, placements
from benchmarks.bench.scale_report import format_scale_table, node_row, run_row

SHARD = 1000


def test_writer_placement_is_measured_only_where_storage_filesystem_has_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert placements(["writer", "storage"], supported=True) == ["storage", "writer"]
    assert capsys.readouterr().err == ""
    assert placements(["storage", "writer"], supported=False) == ["storage"]
    assert placements(["writer"], supported=False) == ["storage"]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 2 and "no placement parameter" in said[0], said


def test_a_nodes_disk_counts_allocated_bytes_and_finds_its_ranks_shards_by_content(
    tmp_path: Path,
) -> None:
    shard = 8192
    copy, placed = tmp_path / "node", tmp_path / "node.placed"
    for i, checkpoint in enumerate(("checkpoint_1", "checkpoint_2")):
        d = copy / "runs" / "scale" / checkpoint
        d.mkdir(parents=True)
        (d / "shard-0.bin").write_bytes(bytes([i]) * shard)
        (d / "shard-1.bin").write_bytes(bytes([10 + i]) * shard)
    stub = copy / "runs" / "scale" / "checkpoint_2" / "shard-2.bin"
    with open(stub, "wb") as f:  # a sparse file: its size, almost none of it allocated
        f.write(b"record")
        f.truncate(64 * 1024 * 1024)
    (placed / "blob").mkdir(parents=True)
    (placed / "blob" / "a1b2").write_bytes(bytes([20]) * shard)
    roots = [str(copy), str(placed)]
    assert 5 * shard <= disk_bytes(roots) < 5 * shard + 1024 * 1024
    sha = {i: hashlib.sha256(bytes([i]) * shard).hexdigest() for i in (0, 1, 10, 20)}
    assert own_shard_files(roots, shard, {sha[0], sha[1]}) == 2
    assert own_shard_files(roots, shard, {sha[20]}) == 1  # a blob, whatever its name
    assert own_shard_files(roots, shard, {hashlib.sha256(b"other").hexdigest()}) == 0
    assert disk_bytes([str(tmp_path / "missing")]) == 0


def rounds_moved(ranks: int) -> list[Bytes]:
    """Two rounds of today's layout: each rank's node pushes its shard to the
    storage node and to the replica node (one from its store, one spilled)."""
    both = {"PushedFromLocalPlasma": float(SHARD), "PushedFromLocalDisk": float(SHARD)}
    one: Bytes = {"s": {"Received": ranks * SHARD}, "r": {"Received": ranks * SHARD}}
    one |= {f"w{i}": both for i in range(ranks)}
    return [one, one]


def test_a_runs_figures_are_shards_per_round_and_copies_against_the_kept_shards() -> None:
    moved = rounds_moved(4)
    restore: Bytes = {"s": {"PushedFromLocalPlasma": 2 * SHARD}, "w0": {"Received": SHARD}}
    storage = node_row("s", moved, 8 * SHARD, restore, SHARD, None)
    assert storage["received"] == [4.0, 4.0] and storage["received_per_round"] == 4.0
    assert storage["sent_per_round"] == 0.0 and storage["disk_shards"] == 8.0
    assert (storage["restore_received"], storage["restore_sent"]) == (0.0, 2.0)
    worker = node_row("w0", moved, 0, restore, SHARD, 0)
    assert worker["sent"] == [2.0, 2.0] and worker["restore_received"] == 1.0
    nodes = {"storage": storage, "replica": node_row("r", moved, 8 * SHARD, {}, SHARD, None)}
    nodes["rank0"] = worker
    row = run_row(
        "storage", 4, SHARD, 2, None, nodes=nodes, round_s=[3.0, 1.0, 2.0],
        restore_s=[0.5, 0.7], kept=8,
    )  # fmt: skip
    assert (row["status"], row["verified"], row["round_median_s"]) == ("ok", True, 2.0)
    assert row["disk_shards"] == 16.0 and row["copies_x"] == 2.0
    assert row["busiest_received_per_round"] == 4.0 and row["storage_disk_shards"] == 8.0
    assert row["restore_max_s"] == 0.7
    table = format_scale_table([row])
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["placement", "ranks", "node"]
    assert [line.split()[2] for line in lines[2:]] == ["storage", "replica", "rank0", "all"]
    assert lines[-1].split()[3:] == [
        "8.00", "2.00", "16.00", "1.00", "2.00", "2.000", "0.700", "2.00", "yes",
    ]  # fmt: skip


def test_a_failed_run_says_why_in_its_row_and_under_the_table() -> None:
    row = run_row("writer", 2, SHARD, 3, "rank 1's restored shard differs")
    assert (row["status"], row["verified"], row["copies_x"], row["nodes"]) == (
        "failed", False, None, {},
    )  # fmt: skip
    table = format_scale_table([row])
    assert table.splitlines()[-1] == "  writer 2 ranks failed: rank 1's restored shard differs"


@pytest.mark.parametrize(
    "flags", [["--scale", "--train"], ["--scale", "--plot", "x.png"], ["--scale", "--cross-node"]]
)
def test_scale_is_a_run_of_its_own(flags: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", *flags]) == 2
    assert "--scale" in capsys.readouterr().err
