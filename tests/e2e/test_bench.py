"""``python -m benchmarks bench``: a smoke run of every contender on tiny checkpoints
(in a subprocess, with its own Ray), and unit tests of the parts that decide without
running anything. No timing is asserted: only that the report is complete and every
transfer that ran came back byte-identical."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from air_transfer.config import GiB, MiB, TransferConfig
from air_transfer.transfer.strategies import strategies
from benchmarks import bench
from benchmarks.__main__ import main

RESULT_KEYS = {
    "contender", "size_gb", "layout", "status", "reason", "seconds", "median_s", "min_s",
    "max_s", "s_per_gb", "ratio_to_cp", "ratio_to_cp_direct", "call_seconds",
    "call_median_s", "call_max_s", "pack_s", "unpack_s", "producer_peak_private_mib",
    "consumer_peak_private_mib", "agent_peak_private_mib", "object_store_peak_mib", "verified",
}  # fmt: skip
#: Ray Train's controller polls its workers every 2 s by default, and a Train run
#: ends (and a report made right after another returns) only at a poll; the smoke
#: runs poll faster so that three short Train runs stay short.
FAST_TRAIN_POLL = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2"}


def run_bench_cli(
    tmp: Path, *flags: str, env: dict[str, str] | None = None
) -> tuple[dict, subprocess.CompletedProcess]:
    """Run the bench as a subprocess (so its Ray never meets one this process has)."""
    report = tmp / "bench.json"
    cmd = [
        sys.executable, "-m", "benchmarks", "bench", "--sizes", "0.004", "--repeats", "1",
        "--json", str(report), "--plot", str(tmp / "bench.png"),
        "--data-dir", str(tmp / "data"), "--num-cpus", "2", "--clean", "--no-prefault", *flags,
    ]  # fmt: skip
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
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

    report, proc = run_bench_cli(tmp_path, "--train", "--no-warmup", env=FAST_TRAIN_POLL)
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


def test_cp_direct_copies_large_files_exactly_around_the_page_cache(tmp_path: Path) -> None:
    """``cp-direct``'s copy function: a file big enough for ``O_DIRECT`` (with a tail
    that is not a whole block) and a small one come out identical, mode and mtime
    included; the smoke runs' checkpoints are too small to take the direct path."""
    from air_transfer.core.direct_io import MIN_DIRECT_FILE_BYTES, should_write_direct
    from benchmarks.bench.endpoint import copy_direct

    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(MIN_DIRECT_FILE_BYTES + 4097)
    (src / "model.bin").write_bytes(big)
    (src / "config.json").write_bytes(b"{}")
    os.chmod(src / "model.bin", 0o640)
    os.utime(src / "model.bin", ns=(1_600_000_000_123_456_789,) * 2)
    assert should_write_direct(len(big))
    out = tmp_path / "out"
    shutil.copytree(src, out, symlinks=True, copy_function=copy_direct)
    assert (out / "model.bin").read_bytes() == big
    assert (out / "config.json").read_bytes() == b"{}"
    st = os.stat(out / "model.bin")
    assert (st.st_mode & 0o777, st.st_mtime_ns) == (0o640, 1_600_000_000_123_456_789)


# -- deciding without running ------------------------------------------------------------


def test_blob_prediction_is_eight_times_the_checkpoint() -> None:
    config = TransferConfig()
    assert bench.predicted_peak_bytes("blob", 10**9, config) == 8 * 10**9
    assert bench.predicted_peak_bytes("tune", 10**9, config) == 6 * 10**9
    assert bench.predicted_peak_bytes("cp", 10**12, config) == 0
    assert bench.predicted_peak_bytes("cp-direct", 10**12, config) == 0


def test_huge_blob_is_skipped_with_a_reason() -> None:
    reason = bench.skip_reason("blob", 10**13, TransferConfig(), 24 * GiB, 2 * GiB)
    assert reason is not None
    assert "predicted peak memory" in reason and "'blob'" in reason and "GiB" in reason
    row = bench.skipped("blob", "big", 10_000.0, 10**13, reason)
    assert row["status"] == "skipped" and row["reason"] == reason and not row["verified"]


def test_chunked_is_bounded_by_the_object_store_not_the_checkpoint() -> None:
    config = TransferConfig()
    assert bench.skip_reason("chunked", 10**13, config, 24 * GiB, 2 * GiB, 4 * GiB) is None
    assert bench.skip_reason("tune", 10**13, config, 24 * GiB, 2 * GiB, 4 * GiB)


def test_inline_is_skipped_above_its_limit() -> None:
    config = TransferConfig()
    assert bench.skip_reason("inline", config.inline_limit, config, 24 * GiB, GiB) is None
    reason = bench.skip_reason("inline", config.inline_limit + 1, config, 24 * GiB, GiB)
    assert reason and "inline_limit" in reason


def test_every_registered_strategy_is_a_contender() -> None:
    assert set(strategies) <= set(bench.all_contenders())
    assert "raw" not in bench.default_contenders(cross_node=False)
    assert "raw" in bench.default_contenders(cross_node=True)
    for name in bench.all_contenders():
        assert callable(bench.contender_function(name))


@pytest.mark.parametrize("layout", bench.LAYOUTS)
def test_layout_plan_adds_up(layout: str) -> None:
    size = 3 * MiB + 12345
    files, _ = bench.layout_plan(layout, size, 8 * 1024)
    total = sum(n for _, n in files)
    assert total == size if layout != "small" else abs(total - size) <= 8 * 1024
    assert len({path for path, _ in files}) == len(files)


def test_tree_digest_finds_a_changed_byte(tmp_path: Path) -> None:
    a = bench.make_checkpoint(str(tmp_path), "mixed", 200_000, 4096)
    assert bench.make_checkpoint(str(tmp_path), "mixed", 200_000, 4096) == a  # cached
    expected = bench.tree_digest(a)
    assert bench.first_difference(expected, bench.tree_digest(a)) is None
    with open(os.path.join(a, "model.bin"), "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 1]))
    assert "model.bin" in bench.first_difference(expected, bench.tree_digest(a))
    os.rmdir(os.path.join(a, "logs"))
    assert "'logs' is missing" in bench.first_difference(expected, bench.tree_digest(a))
    assert bench.clean_data_dir(str(tmp_path)) == [os.path.basename(a)]


def test_linearity_compares_largest_with_the_size_nearest_half_a_gb() -> None:
    def row(size: float, rate: float, status: str = "ok") -> dict:
        return {"contender": "c", "layout": "big", "size_gb": size, "s_per_gb": rate,
                "status": status}  # fmt: skip

    rows = [row(0.1, 1.0), row(0.5, 2.0), row(4, 3.0), row(8, None, "skipped")]
    assert bench.linearity(rows)["big"]["c"] == {
        "ratio": 1.5, "largest_size_gb": 4, "reference_size_gb": 0.5,
    }  # fmt: skip
    assert bench.linearity([row(1, 1.0)])["big"]["c"] is None


def test_help_explains_every_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["bench", "--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for flag in (
        "--sizes", "--layout", "--small-file-kib", "--small-files", "--repeats",
        "--contenders", "--chunk-mib", "--window", "--cross-node", "--data-dir", "--clean",
        "--json", "--plot", "--no-warmup", "--drop-caches", "--num-cpus", "--object-store-mb",
        "--no-prefault", "--memory-margin-gb", "--no-direct-io", "--train", "--readers",
    ):  # fmt: skip
        assert flag in text
