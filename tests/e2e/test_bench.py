"""``python -m benchmarks bench``: a smoke run of every contender on tiny checkpoints
(in a subprocess, with its own Ray). No timing is asserted: only that the report is
complete and every transfer that ran came back byte-identical. The parts that decide
without running anything are tested in ``tests/unit/test_benchmarks.py``."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import ray

from air_transfer.transfer.strategies import strategies
from benchmarks import bench
from benchmarks.bench import session
from benchmarks.units import MiB
from tests.support.procs import REPO_ROOT, child_env

RESULT_KEYS = {
    "contender", "size_gb", "layout", "status", "reason", "seconds", "median_s", "min_s",
    "max_s", "s_per_gb", "ratio_to_cp", "ratio_to_cp_direct", "call_seconds",
    "call_median_s", "call_max_s", "pack_s", "unpack_s", "producer_peak_private_mib",
    "consumer_peak_private_mib", "agent_peak_private_mib", "object_store_peak_mib", "verified",
}  # fmt: skip


def run_bench_cli(tmp: Path, *flags: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Run the bench as a subprocess (so its Ray never meets one this process has; its
    Train runs poll as fast as the tests' own, ``tests/conftest.py``)."""
    report = tmp / "bench.json"
    cmd = [
        sys.executable, "-m", "benchmarks", "bench", "--sizes", "0.004", "--repeats", "1",
        "--json", str(report), "--plot", str(tmp / "bench.png"),
        "--data-dir", str(tmp / "data"), "--num-cpus", "2", "--clean", "--no-prefault", *flags,
    ]  # fmt: skip
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 0, f"bench failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(report.read_text()), proc


def check_report(report: dict, contenders: list[str], layouts: list[str], tmp: Path) -> None:
    assert set(report) >= {"config", "machine", "results", "linearity"}
    results = report["results"]
    assert {(r["contender"], r["layout"]) for r in results} == {
        (c, layout) for c in contenders for layout in layouts
    }
    for r in results:
        assert set(r) >= RESULT_KEYS, f"missing {RESULT_KEYS - set(r)} in {r}"
        assert r["status"] in ("ok", "skipped", "failed")
        if r["status"] == "skipped":
            assert r["reason"]
            continue
        assert r["status"] == "ok", r
        assert r["verified"] is True, r
        assert len(r["seconds"]) == 1 and r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["consumer_peak_private_mib"] > 0
        assert r["ratio_to_cp"] is not None
    assert set(report["linearity"]) == set(layouts)
    assert report["config"]["transfer_config"]["direct_io"] is True  # the default
    assert (tmp / "bench.png").read_bytes().startswith(b"\x89PNG")
    assert not any((tmp / "data").glob("*")), "--clean left cached data behind"


def shipped_contenders() -> list[str]:
    """Every contender the bench subprocess will know: the built-ins and the
    strategies air_transfer registers itself, not test-only ones registered here."""
    return [
        name
        for name in bench.all_contenders()
        if name not in strategies or strategies[name].__module__.startswith("air_transfer.")
    ]


@pytest.fixture(scope="module")
def single_node(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, str, Path]:
    tmp = tmp_path_factory.mktemp("bench")
    contenders = shipped_contenders()
    # One layout with every kind of file (a big one, shards, small files, an empty
    # one): each layout costs every contender a fresh actor pair.
    report, proc = run_bench_cli(
        tmp, "--layout", "mixed", "--small-file-kib", "64", "--no-warmup",
        "--contenders", *contenders,
    )  # fmt: skip
    return report, proc.stdout + proc.stderr, tmp


def test_every_contender_round_trips_verified(single_node: tuple[dict, str, Path]) -> None:
    report, _, tmp = single_node
    check_report(report, shipped_contenders(), ["mixed"], tmp)
    by_name = {(r["contender"], r["layout"]): r for r in report["results"]}
    for local_copy in ("cp", "cp-direct"):  # no producer process
        assert by_name[local_copy, "mixed"]["producer_peak_private_mib"] is None
        assert by_name[local_copy, "mixed"]["call_median_s"] is None
    assert by_name["chunked", "mixed"]["producer_peak_private_mib"] > 0
    for layout in ("mixed",):
        for name in ("chunked", "chunked-async"):  # the producer's blocking call, timed
            row = by_name[name, layout]
            assert len(row["call_seconds"]) == 1 and row["call_median_s"] > 0, row
            assert row["agent_peak_private_mib"] > 0  # the node's agent packs
            assert row["pack_s"] > 0 and row["ratio_to_cp_direct"] is not None
        async_row = by_name["chunked-async", layout]
        # The async call returns before packing is done; the sync one only after.
        assert async_row["call_median_s"] <= async_row["pack_s"], async_row
    # Explicitly off: AIR_TRANSFER_PROGRESS in the environment never reaches the timed runs.
    assert report["config"]["transfer_config"]["progress"] is False


def test_output_has_table_progress_and_linearity(single_node: tuple[dict, str, Path]) -> None:
    _, output, _ = single_node
    assert "contender" in output and "s/GB" in output and "linearity" in output
    assert "call_s" in output and "chunked-async" in output
    assert "[1/" in output  # one progress line per measurement


def test_cross_node_with_raw(tmp_path: Path) -> None:
    """Also the one run with the (default) warm-up round trip per actor pair, the
    store warm-up of both nodes' agents, and ``--progress`` (bars from the actors,
    through tqdm_ray, on stderr)."""
    contenders = ["cp", "chunked", "chunked-async", "raw"]
    report, proc = run_bench_cli(
        tmp_path, "--cross-node", "--progress", "--contenders", *contenders
    )
    check_report(report, contenders, ["big"], tmp_path)
    assert report["config"]["cross_node"] is True
    assert report["config"]["transfer_config"]["progress"] is True
    assert "__ray_tqdm_magic_token__" not in proc.stdout + proc.stderr


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
    per reader)."""
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
    assert "read_x" in proc.stdout and "n-readers" in proc.stdout


def test_dcp_mode_restores_each_rank_its_share_verified(tmp_path: Path) -> None:
    """``--dcp``: Ray's recipe and ours each save and restore a hand-sharded model
    from 2 ranks, every restore verified; ours moves each rank less than Ray's
    recipe (the whole checkpoint per rank) and keeps no local temp copy. 1 MiB
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
    assert set(rows) == {"ray-recipe", "air-transfer"}
    for r in rows.values():
        assert r["status"] == "ok" and r["verified"] is True, r
        assert len(r["save_s"]) == 2 and r["save_wall_s"] > 0 and r["restore_wall_s"] > 0
    ours, ray_recipe = rows["air-transfer"], rows["ray-recipe"]
    for mine, theirs in zip(ours["restore_bytes"], ray_recipe["restore_bytes"], strict=True):
        assert 0 < mine < theirs, (ours, ray_recipe)
    assert ours["local_temp_bytes"] == [0, 0] and min(ray_recipe["local_temp_bytes"]) > 0
    assert "ray-recipe" in proc.stdout and "restore MiB" in proc.stdout


# -- starting Ray -------------------------------------------------------------------------


def raylets() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True) if p.name() == "raylet"]


def shared_memory_mapped(process: psutil.Process) -> int:
    """Bytes of shared memory (the object store) ``process`` has faulted in."""
    for line in Path(f"/proc/{process.pid}/status").read_text().splitlines():
        if line.startswith("RssShmem:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no RssShmem in /proc/{process.pid}/status")


def test_ray_starts_without_faulting_its_object_store_in() -> None:
    """Defect: the bench started Ray with its object store preallocated
    (MAP_POPULATE, before the raylet may connect to it); on a fresh machine a
    6.27 GB store took longer than the raylet waits, and the main command died at
    start ("The current node timed out during startup"). The raylet now maps its
    store without touching it, whatever its size."""
    assert not ray.is_initialized()
    store = 512 * MiB
    with session.ray_session(False, 1, store):
        (raylet,) = raylets()
        assert shared_memory_mapped(raylet) < store // 4


def test_a_failed_start_is_retried_once_with_a_smaller_store(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Should Ray not start, the session stops what the failed start left running
    (Ray leaves its GCS server up) and starts Ray once more with a smaller store,
    saying so. The first start here really fails: a store twice the memory."""
    assert not ray.is_initialized()
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    too_big = 2 * psutil.virtual_memory().total
    with session.ray_session(False, 1, too_big, retry_store_bytes=256 * MiB) as how:
        assert "started again with a 0.27 GB store" in how
        assert ray.cluster_resources()["object_store_memory"] == 256 * MiB
    err = capsys.readouterr().err
    assert f"Ray did not start with a {too_big / 1e9:.2f} GB object store" in err
    assert "starting it once more with 0.27 GB" in err
    left = psutil.Process().children(recursive=True)
    _, alive = psutil.wait_procs([p for p in left if p.pid not in before], timeout=30)
    assert not alive, f"left running: {[p.name() for p in alive]}"


def test_a_failed_start_is_retried_with_half_the_store_once() -> None:
    assert session.retry_store_size(6_270_000_000) == 3_135_000_000
    assert session.retry_store_size(300 * MiB) == session.MIN_STORE_BYTES
    assert session.retry_store_size(session.MIN_STORE_BYTES) is None
