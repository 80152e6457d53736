"""``max_lag_bytes``: a report is admitted only while the bytes not yet in the durable
tier, with its own, stay within the limit, counted as node storage stands at that
moment (a report that landed mid-pass counts at once), so the bound holds at every
moment of a run of reports faster than the tier (no Ray: a local tier at a capped
rate)."""

from __future__ import annotations

import threading
from pathlib import Path

from air_transfer.storage.durable.settings import DrainSettings
from tests.support.drains import drained, draining, local_target
from tests.support.trees import write_file
from tests.support.waiting import eventually

MiB = 1024 * 1024


def test_reports_faster_than_the_tier_stay_within_max_lag_bytes(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    limit, report = 3 * MiB // 2, MiB  # two reports not yet durable pass the limit
    settings = DrainSettings(
        chunk_bytes=256 * 1024, bytes_per_s=4 * MiB, max_lag_bytes=limit, rescan_s=60.0,
        backoff_s=(0.05, 0.5),
    )  # fmt: skip
    seen: list[int] = []
    stop = threading.Event()
    with draining(root, target, settings) as drainer:

        def watch() -> None:  # what is not durable, as node storage stands, throughout
            while not stop.is_set():
                seen.append(drainer.work.lag_bytes())

        watcher = threading.Thread(target=watch)
        watcher.start()
        waited = 0
        try:
            for step in range(6):
                key = drainer.admit(report)
                if key is None:
                    waited += 1
                    key = eventually(lambda: drainer.admit(report), f"report {step} admitted", 60)
                write_file(root / f"ckpt_{step}" / "model.bin", bytes([step]) * report)
                drainer.touch()
                drainer.release(key)
        finally:
            stop.set()
            watcher.join()
        drained(drainer)
    assert waited >= 1  # the tier was slower than the reports: some waited
    assert len(seen) > 10 and max(seen) <= limit, max(seen)


def test_a_report_larger_than_the_limit_waits_until_nothing_else_is_behind(
    tmp_path: Path,
) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    settings = DrainSettings(
        chunk_bytes=256 * 1024, bytes_per_s=2 * MiB, max_lag_bytes=MiB // 4, rescan_s=60.0
    )
    with draining(root, target, settings) as drainer:
        write_file(root / "ckpt_0" / "model.bin", b"0" * (MiB // 2))
        drainer.touch()
        assert drainer.admit(MiB) is None  # 512 KiB behind: it waits
        key = eventually(lambda: drainer.admit(MiB), "the big report admitted", 60)
        assert drainer.status().lag_bytes >= MiB  # its room is counted until released
        drainer.release(key)
        assert drainer.status().lag_bytes == 0
