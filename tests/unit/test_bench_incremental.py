"""``bench --incremental``'s decisions without Ray: the report directories share 90%
of their bytes (one copy on disk), disk use counts each inode once, and the ratios
and table read what the rows say."""

from __future__ import annotations

import os
from pathlib import Path

from benchmarks.bench.incremental_path import (
    FILES,
    FULL,
    INCREMENTAL,
    REPORTS,
    add_ratios,
    disk_used,
    format_incremental_table,
    make_sources,
)


def test_reports_share_all_but_one_file_stored_once(tmp_path: Path) -> None:
    sources = make_sources(str(tmp_path), FILES * 8192)
    assert len(sources) == REPORTS
    names = sorted(os.listdir(sources[0]))
    assert len(names) == FILES and all(sorted(os.listdir(s)) == names for s in sources)
    heads = {Path(s, "head.bin").read_bytes() for s in sources}
    assert len(heads) == REPORTS  # new bytes each report
    layer = {os.stat(Path(s, "layer0.bin")).st_ino for s in sources}
    assert len(layer) == 1
    # The frozen files once, the heads once each: 9 + 5 files of 8 KiB.
    assert disk_used(str(tmp_path)) == (FILES - 1 + REPORTS) * 8192


def test_ratios_and_table(tmp_path: Path) -> None:
    rows = [
        {"contender": FULL, "status": "ok", "checkpoint_bytes": 100, "sent_bytes": 500,
         "written_bytes": 500, "disk_bytes": 500, "report_median_s": 2.0},
        {"contender": INCREMENTAL, "status": "ok", "checkpoint_bytes": 100,
         "sent_bytes": 140, "written_bytes": 140, "disk_bytes": 140, "report_median_s": 1.0},
    ]  # fmt: skip
    add_ratios(rows)
    assert rows[1]["sent_bytes_ratio_to_full"] == 0.28
    assert rows[1]["disk_x_one_checkpoint"] == 1.4 and rows[0]["disk_x_one_checkpoint"] == 5
    assert rows[1]["report_median_s_ratio_to_full"] == 0.5
    table = format_incremental_table(rows).splitlines()
    assert table[2].split()[:3] == [INCREMENTAL, "0.000", "0.28"] and table[2].endswith("yes")
