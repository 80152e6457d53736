"""``benchmarks.bench.dcp_cpu``'s report: each phase's CPU seconds per process, as
rank 0 measured them, and the table's line per contender."""

from __future__ import annotations

from benchmarks.bench.dcp_cpu import add_phase_cpu, format_phase_cpu

SAVE = {"rank 1": 0.5, "other": 0.25, "raylet": 0.1, "rank 0": 0.75, "storage agent": 0.4,
        "total": 2.0}  # fmt: skip
RESTORE = {"rank 0": 0.3, "rank 1": 0.2, "gcs_server": 0.01, "total": 0.51}


def test_a_row_takes_rank_0s_figures_of_each_phase() -> None:
    row: dict[str, object] = {}
    ranks = [{"save_cpu_s": SAVE, "restore_cpu_s": RESTORE},
             {"save_cpu_s": None, "restore_cpu_s": None}]  # fmt: skip
    add_phase_cpu(row, ranks)
    assert row == {"save_cpu_s": SAVE, "restore_cpu_s": RESTORE}


def test_each_role_reads_save_then_restore_ranks_first_and_total_last() -> None:
    ok = {"contender": "air-transfer", "status": "ok", "save_cpu_s": SAVE,
          "restore_cpu_s": RESTORE}  # fmt: skip
    failed = {"contender": "ray-recipe", "status": "failed"}
    head, line = format_phase_cpu([failed, ok]).splitlines()
    assert "save/restore" in head
    assert line == (
        "  air-transfer: rank 0 0.75/0.30, rank 1 0.50/0.20, storage agent 0.40/0.00, "
        "raylet 0.10/0.00, gcs_server 0.00/0.01, other 0.25/0.00, total 2.00/0.51"
    )
    assert format_phase_cpu([failed]) == ""
