"""The benchmarks package's parts that decide without running a transfer: which
contender is skipped and why, the layouts, the digests, the linearity, the warm-up
size, the flags of ``bench`` and ``demo``, and ``cp-direct``'s copy (no Ray). The
smoke runs are in ``tests/e2e/test_bench.py`` and ``test_demo.py``."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from air_transfer.config import GiB, MiB, TransferConfig
from air_transfer.transfer.strategies import strategies
from benchmarks import bench
from benchmarks.__main__ import build_parser, main
from benchmarks.bench.runner import warmup_size
from tests.support.direct import direct_writers, skip_unless_o_direct


def test_cp_direct_copies_large_files_exactly_around_the_page_cache(tmp_path: Path) -> None:
    """``cp-direct``'s copy function: a file big enough for ``O_DIRECT`` (with a tail
    that is not a whole block) is written with it, and it and a small one come out
    identical, mode and mtime included; the smoke runs' checkpoints are too small to
    take the direct path. (A copy that fell back to the page cache passed before.)"""
    from air_transfer.core.direct_io import MIN_DIRECT_FILE_BYTES, should_write_direct
    from benchmarks.bench import endpoint

    skip_unless_o_direct(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    big = os.urandom(MIN_DIRECT_FILE_BYTES + 4097)
    (src / "model.bin").write_bytes(big)
    (src / "config.json").write_bytes(b"{}")
    os.chmod(src / "model.bin", 0o640)
    os.utime(src / "model.bin", ns=(1_600_000_000_123_456_789,) * 2)
    assert should_write_direct(len(big))
    out = tmp_path / "out"
    with direct_writers(endpoint) as writers:
        shutil.copytree(src, out, symlinks=True, copy_function=endpoint.copy_direct)
    assert [(w.path, w.direct) for w in writers] == [(str(out / "model.bin"), True)]
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
        "--dcp", "--dcp-mib", "--scale", "--ranks", "--placement", "--scale-mib",
        "--scale-rounds",
    ):  # fmt: skip
        assert flag in text


def test_warmup_trip_is_two_chunks_but_never_above_the_smallest_checkpoint() -> None:
    config = TransferConfig(chunk_bytes=32 * MiB)
    assert warmup_size(config, 10**9) == 64 * MiB  # fresh chunk buffers met untimed
    assert warmup_size(config, 4 * 10**6) == 4 * 10**6  # what 'inline' can carry too


def test_demo_flags() -> None:
    opts = build_parser().parse_args(["demo", "--workers", "1"])
    assert (opts.size_mb, opts.reports, opts.workers, opts.storage) == (256, 3, 1, None)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--size-mb", "0"])


def test_the_object_store_holds_the_largest_checkpoint_without_spilling() -> None:
    """Ray spills once a store is 80% full, and a chunked trip holds every chunk until
    it is dropped: the store the bench starts holds the largest checkpoint with room
    (8 GB on a 24 GiB machine spilled with 30% of memory), within half of memory
    (30% per node across two nodes), and never under the floor."""
    from benchmarks.bench.session import MIN_STORE_BYTES, auto_store_bytes

    total = 24 * GiB
    for gb, cross_node in ((8, False), (4, True), (1, False)):
        store = auto_store_bytes(gb * 10**9, cross_node, 2, total)
        assert 0.8 * store >= 1.1 * gb * 10**9, (gb, cross_node, store)  # 10% to spare
    assert auto_store_bytes(40 * 10**9, False, 2, total) == total // 2
    assert auto_store_bytes(40 * 10**9, True, 2, total) == int(total * 0.3)
    assert auto_store_bytes(1, False, 2, total) >= MIN_STORE_BYTES
