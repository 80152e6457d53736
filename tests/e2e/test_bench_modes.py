"""The bench's other modes as smoke runs (each in a subprocess, with its own Ray):
``--train``, ``--readers``, ``--dcp``, ``--tiered`` and ``--scale``, every transfer
verified, no timing asserted."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench.dcp_async import ROUNDS
from tests.support.bench_cli import RESULT_KEYS, run_bench_cli
from tests.support.procs import REPO_ROOT, child_env

# Each test runs a bench (or the demo) with its own Ray: the shared one is stopped.
pytestmark = pytest.mark.usefixtures("no_ray")


def test_train_mode_reports_and_restores_verified_against_both_floors(tmp_path: Path) -> None:
    """``--train``: every path and floor measured, every stored and restored
    checkpoint verified, each Train row held against its floor."""
    from benchmarks.bench.train_path import ROWS

    report, proc = run_bench_cli(tmp_path, "--train", "--no-warmup")
    assert report["mode"] == "train"
    rows = {r["contender"]: r for r in report["results"]}
    assert list(rows) == list(ROWS)
    for name, r in rows.items():
        assert set(r) >= {*RESULT_KEYS, "floor", "ratio_to_floor", "ratio_to_raw"}
        assert r["status"] == "ok" and r["verified"] is True, r
        assert len(r["seconds"]) == 1 and r["median_s"] > 0
        assert r["floor"] == ROWS[name]
        assert (r["ratio_to_floor"] is None) == (ROWS[name] is None), r
    assert rows["report/other-node"]["floor"] == "raw"
    assert rows["restore/storage-node"]["floor"] == "cp-direct"
    assert "x_floor" in proc.stdout and "report/local-fs" in proc.stdout
    assert not any((tmp_path / "data").glob("*")), "--clean left cached data behind"


def test_readers_mode_reads_the_storage_disk_once(tmp_path: Path) -> None:
    """``--readers 2``: one reader alone, then both at once, verified, with the
    storage node's counters (read once whatever the readers: 1.0x; served once
    per reader) and Ray's bytes moved per node (received once per reader)."""
    report, proc = run_bench_cli(tmp_path, "--readers", "2", "--no-warmup")
    assert report["mode"] == "readers"
    one, both = report["results"]
    assert (one["contender"], one["readers"], both["contender"], both["readers"]) == (
        "one-reader", 1, "n-readers", 2,
    )  # fmt: skip
    for r in (one, both):
        assert r["status"] == "ok" and r["verified"] is True, r
        assert r["read_ratio"] == [1.0], r
        assert len(r["reader_seconds"]) == r["readers"] and r["ratio_to_one"] > 0
    assert one["served_ratio"] == [1.0] and both["served_ratio"] == [2.0]
    # Ray's bytes per node: each reader received the checkpoint once, from the
    # storage node or from the other reader.
    for r in (one, both):
        [moved] = r["pushed"]
        received = sum(n["received"] for n in moved.values())
        assert received == pytest.approx(r["readers"], rel=0.02), moved
        assert sum(n["pushed"] for n in moved.values()) == pytest.approx(received, rel=0.02)
    assert "read_x" in proc.stdout and "n-readers" in proc.stdout


def test_dcp_mode_restores_each_rank_its_share_verified(tmp_path: Path) -> None:
    """``--dcp``: Ray's recipe and ours each save and restore a hand-sharded model
    from 2 ranks (ours also an async save and a second, incremental save), every
    restore verified; ours moves each rank less than Ray's recipe (the whole
    checkpoint per rank) and keeps no local temp copy; the raw Ray floor moves each
    rank exactly its tensors' bytes; each load's private memory growth is measured
    (a growth, not the process's size), and so is each phase's CPU per process. 1 MiB
    chunks: the replicated ``step`` in the other rank's file costs one chunk of it."""
    report = tmp_path / "dcp.json"
    cmd = [
        sys.executable, "-m", "benchmarks", "bench", "--dcp", "--dcp-mib", "4",
        "--chunk-mib", "1",
        "--json", str(report), "--data-dir", str(tmp_path / "data"), "--num-cpus", "2",
        "--no-prefault",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=child_env(), cwd=REPO_ROOT
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(report.read_text())
    assert result["mode"] == "dcp" and "sharded" in result["config"]["state"]
    rows = {r["contender"]: r for r in result["results"]}
    assert set(rows) == {"raw-ray-floor", "ray-recipe", "air-transfer", "air-incremental"}
    for r in rows.values():
        assert r["status"] == "ok" and r["verified"] is True, r
        assert len(r["save_s"]) == 2 and r["save_wall_s"] > 0 and r["restore_wall_s"] > 0
    # The floor moved each rank's tensors' bytes, no more, and measured no load.
    floor = rows["raw-ray-floor"]
    assert floor["restore_bytes"] == floor["state_bytes"] and min(floor["state_bytes"]) > 0
    assert min(floor["save_s"]) > 0 and floor["load_anon_bytes"] is None
    # Each load's peak private memory: a growth over the load's start (bounded by a
    # few shares, where the process itself holds far more), seen by the sampler.
    assert result["config"]["largest_tensor_mib"] == 4.0
    loads = {name: rows[name]["load_anon_bytes"] for name in rows if name != "raw-ray-floor"}
    for name, growth in loads.items():
        assert len(growth) == 2 and all(0 <= g <= 4 * max(floor["state_bytes"]) for g in growth)
        beyond = rows[name]["load_anon_beyond_ray_bytes"]
        assert beyond == [a - b for a, b in zip(growth, loads["ray-recipe"], strict=True)]
    assert sum(map(sum, loads.values())) > 0, loads
    # The second, incremental save sent part of the state and reused the rest.
    incremental = rows["air-incremental"]
    assert incremental["second_bytes_sent"] > 0 and incremental["second_bytes_reused"] > 0
    assert 0 < incremental["second_sent_fraction"] < 1, incremental
    ours, ray_recipe = rows["air-transfer"], rows["ray-recipe"]
    # The async saves: their blocking part and the staging it is held against, both
    # timed in each round, each figure the rank's median; every save completed (1 +
    # ROUNDS checkpoints committed), the last restored (verified above).
    for key in ("staging", "async_save", "async_done"):
        per_rank = ours[f"{key}_rounds_s"]
        assert [len(r) for r in per_rank] == [ROUNDS] * 2 and min(map(min, per_rank)) > 0
    for key in ("staging", "async_save"):
        assert ours[f"{key}_s"] == [statistics.median(r) for r in ours[f"{key}_rounds_s"]]
    assert ours["async_done_s"] == max(map(statistics.median, ours["async_done_rounds_s"]))
    assert ours["async_to_staging"] == [
        pytest.approx(a / s) for a, s in zip(ours["async_save_s"], ours["staging_s"], strict=True)
    ]
    assert ours["async_reported"] == 1 + ROUNDS
    assert ours["async_done_s"] >= max(ours["async_save_s"])
    for mine, theirs in zip(ours["restore_bytes"], ray_recipe["restore_bytes"], strict=True):
        assert 0 < mine < theirs, (ours, ray_recipe)
    assert ours["local_temp_bytes"] == [0, 0] and min(ray_recipe["local_temp_bytes"]) > 0
    assert "ray-recipe" in proc.stdout and "restore MiB" in proc.stdout
    # Each phase's CPU seconds per process: both ranks are named in each and worked in
    # the save (a restore of 12 MiB can take less than a clock tick, 10 ms); ours, the
    # storage node's agent too (it writes the save and serves the restore); the total
    # is every process's.
    for name in ("ray-recipe", "air-transfer", "air-incremental"):
        for phase in ("save_cpu_s", "restore_cpu_s"):
            spent = rows[name][phase]
            assert {"rank 0", "rank 1"} <= spent.keys() and spent["total"] > 0, spent
            if phase == "save_cpu_s":
                assert spent["rank 0"] > 0 and spent["rank 1"] > 0, (name, spent)
            others = sum(s for role, s in spent.items() if role != "total")
            assert spent["total"] == pytest.approx(others, abs=0.01), spent
            assert ("storage agent" in spent) == (name != "ray-recipe"), spent
            if name != "ray-recipe":
                assert spent["storage agent"] > 0, (name, phase, spent)
    assert "CPU s per process" in proc.stdout
    assert "raw-ray-floor" in proc.stdout and "load +MiB" in proc.stdout
    assert "async save blocking" in proc.stdout


def test_tiered_mode_reports_into_s3_both_ways_every_restore_verified(tmp_path: Path) -> None:
    """``--tiered --replicas 2``: Ray's S3 path and replicated node storage with a
    durable tier, each ``SYNC`` and ``ASYNC``, on moto's server started by the bench;
    every restore verified (ours from node storage and from the bucket alone, every
    copy emptied first); ours sends less than Ray's path (the unchanged files are
    copied inside the bucket)."""
    out = tmp_path / "tiered.json"
    cmd = [
        sys.executable, "-m", "benchmarks", "bench", "--tiered", "--tiered-mib", "4",
        "--replicas", "2", "--json", str(out), "--data-dir", str(tmp_path / "data"),
        "--num-cpus", "2",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=child_env(), cwd=REPO_ROOT
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(out.read_text())
    assert report["mode"] == "tiered"
    assert report["config"]["replicas"] == 2 and report["config"]["spaced"]
    rows = {r["contender"]: r for r in report["results"]}
    assert list(rows) == ["ray-s3-sync", "ray-s3-async", "air-tiered", "air-tiered-async"]
    for r in rows.values():
        assert r["status"] == "ok", r
        assert len(r["report_s"]) == 5 and r["report_ratio_to_ray_sync"] is not None
    for ours in ("air-tiered", "air-tiered-async"):
        assert set(rows[ours]["restore_s"]) == {"node storage", "bucket"}
        assert 0 < rows[ours]["sent_bytes"] < rows["ray-s3-sync"]["sent_bytes"]
    drain = report["drain"]  # the drain's throughput beside copy_files with threads
    assert drain["drain_mb_s"] > 0 and drain["copy_files_threads_mb_s"] > 0
    assert "x sync" in proc.stdout


def test_scale_mode_counts_each_nodes_shards_per_round_and_restores_verified(
    tmp_path: Path,
) -> None:
    """``--scale --ranks 2``, today's layout: per report round the storage node and
    the replica node each receive every rank's shard, and each rank's node sends its
    shard once or twice (the rest is pushed between the copies); after the run both
    hold the two kept checkpoints' shards and the ranks' nodes none; each rank's
    restore of its own shard is verified and received once."""
    out = tmp_path / "scale.json"
    cmd = [
        sys.executable, "-m", "benchmarks", "bench", "--scale", "--ranks", "2",
        "--placement", "storage", "--scale-mib", "2", "--scale-rounds", "3",
        "--json", str(out), "--data-dir", str(tmp_path / "data"), "--num-cpus", "2",
    ]  # fmt: skip
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=300, env=child_env(), cwd=REPO_ROOT
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    report = json.loads(out.read_text())
    assert report["mode"] == "scale" and report["config"]["num_to_keep"] == 2
    [row] = report["results"]
    assert (row["placement"], row["ranks"], row["status"], row["verified"]) == (
        "storage", 2, "ok", True,
    )  # fmt: skip
    nodes = row["nodes"]
    assert list(nodes) == ["storage", "replica", "rank0", "rank1"]
    approx = pytest.approx
    for name in ("storage", "replica"):
        assert nodes[name]["received"] == approx([2.0] * 3, rel=0.02), nodes[name]
        assert nodes[name]["disk_shards"] == approx(4.0, rel=0.02)
        assert nodes[name]["restore_received"] == 0.0
    for name in ("rank0", "rank1"):
        # A rank's shard leaves its node once or twice: the second copy's agent may
        # pull it from the first copy's node instead (Ray pulls from any holder).
        assert all(0.98 <= sent <= 2.02 for sent in nodes[name]["sent"]), nodes[name]
        assert (nodes[name]["disk_shards"], nodes[name]["own_shard_files"]) == (0.0, 0)
        assert nodes[name]["restore_received"] == approx(1.0, rel=0.02)
    for r in range(3):  # every byte received was pushed by some node in the same round
        sent = sum(n["sent"][r] for n in nodes.values())
        assert sent == approx(4.0, rel=0.02), nodes
    assert row["copies_x"] == approx(2.0, rel=0.02) and len(row["round_s"]) == 3
    assert len(row["restore_s"]) == 2 and row["round_median_s"] > 0
    assert "recv/round" in proc.stdout and "copies_x" in proc.stdout
