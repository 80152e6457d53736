"""``python -m benchmarks bench``: a smoke run of every contender on tiny checkpoints
(in a subprocess, with its own Ray). No timing is asserted: only that the report is
complete and every transfer that ran came back byte-identical. The other modes are in
``test_bench_modes.py``, starting Ray in ``test_bench_startup.py``; the parts that decide
without running anything are tested in ``tests/unit/test_benchmarks.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from air_transfer.transfer.strategies import strategies
from benchmarks import bench
from tests.support.bench_cli import RESULT_KEYS, run_bench_cli

# Each test runs a bench (or the demo) with its own Ray: the shared one is stopped.
pytestmark = pytest.mark.usefixtures("no_ray")


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
