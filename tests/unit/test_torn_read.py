"""Torn reads without Ray: a file rewritten after the scan, or while a span of it is
read in this process (the ``proven_read._after_span_read`` hook, ``tests.support.rewriters``),
raises SourceChangedError naming it; the racy window and the checks other pyarrow
filesystems get. Transfers that race a rewrite are in ``tests/ray/test_torn_pack.py``."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from air_transfer import SourceChangedError
from air_transfer.config import KiB
from air_transfer.core.plan import Span
from air_transfer.core.proven_read import RACY_WINDOW_NS
from air_transfer.core.scan import Source, Stamp, scan
from tests.support.rewriters import CHANGED, RewriteOnce, local_scan, make_source, read_all, rewrite


def test_torn_pack_file_renamed_over_after_the_scan_is_caught(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    source, scanned = local_scan(src)
    rewrite(str(src / "w.bin"), "rename")  # same size and, often, the same mtime tick
    with pytest.raises(SourceChangedError, match=r"w\.bin' was replaced by another file"):
        read_all(source, scanned)


# -- the racy window -----------------------------------------------------------------------
def test_a_file_written_just_now_is_read_after_the_racy_window(
    tmp_path: Path, in_driver: Callable[[Any], None]
) -> None:
    body = os.urandom(10 * KiB)
    (tmp_path / "w.bin").write_bytes(body)
    source, scanned = local_scan(tmp_path)
    read_at: list[int] = []
    in_driver(lambda where, span: read_at.append(time.time_ns()))
    assert read_all(source, scanned) == body
    ctime = scanned.stamps[0].ctime_ns
    assert ctime is not None and read_at[0] - ctime >= RACY_WINDOW_NS


def test_racy_window_catches_a_rewrite_in_the_same_coarse_clock_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_driver: Callable[[Any], None]
) -> None:
    """Timestamps from a coarse clock (10 ms ticks, as at HZ=100; this kernel's own
    are finer): a rewrite within the tick of the scan keeps size, mtime and ctime.
    Reading only once the scanned ctime is a window old puts any write that races
    the read in a later tick, where the fstat after the read sees it."""
    tick = 10_000_000
    assert tick < RACY_WINDOW_NS

    def coarse(cls: type[Stamp], st: os.stat_result) -> Stamp:
        return Stamp(
            st.st_size,
            st.st_mtime_ns - st.st_mtime_ns % tick,
            st.st_ctime_ns - st.st_ctime_ns % tick,
            st.st_ino,
            st.st_dev,
            st.st_nlink,
        )

    monkeypatch.setattr(Stamp, "of_stat", classmethod(coarse))
    (tmp_path / "w.bin").write_bytes(os.urandom(10 * KiB))
    source, scanned = local_scan(tmp_path)
    in_driver(RewriteOnce("w.bin"))
    with pytest.raises(SourceChangedError, match=CHANGED):
        read_all(source, scanned)


def test_torn_pack_on_other_pyarrow_filesystems_checks_size_and_mtime(
    tmp_path: Path, in_driver: Callable[[Any], None]
) -> None:
    """A non-local pyarrow source (S3, GCS; here a SubTreeFileSystem) reports only
    size and mtime: both are compared before and after reading."""
    src = make_source(tmp_path)
    source = Source(pafs.SubTreeFileSystem(str(src), pafs.LocalFileSystem()), "")
    scanned = scan(source)
    assert read_all(source, scanned) == b"".join(
        (src / n).read_bytes() for n in ("a.bin", "w.bin", "z.bin")
    )

    paths = [f.path for f in scanned.files]
    scanned_mtime = scanned.stamps[paths.index("w.bin")].mtime_ns

    def rewrite_with_a_new_mtime(where: str, span: Span) -> None:
        if where.endswith("/w.bin") and span.file_offset >= 8 * KiB:
            rewrite(str(src / "w.bin"), "in-place")
            os.utime(src / "w.bin", ns=(0, scanned_mtime + 1_000_000_000))

    in_driver(rewrite_with_a_new_mtime)
    with pytest.raises(SourceChangedError, match=CHANGED) as e:
        read_all(source, scanned)
    assert "mtime_ns" in str(e.value)
