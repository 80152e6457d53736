"""Torn reads without Ray: a file rewritten after the scan, or while a span of it is
read in this process (the ``proven_read._after_span_read`` hook, ``tests.support.rewriters``),
raises SourceChangedError naming it; the racy window and the checks other pyarrow
filesystems get; what a read of node storage, where no file is written in place,
does not take for a change (a hard link of the file made and dropped meanwhile).
Transfers that race a rewrite are in ``tests/ray/test_torn_pack.py``."""

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
from air_transfer.core.confined_dirs import ConfinedSource
from air_transfer.core.plan import Span
from air_transfer.core.proven_read import RACY_WINDOW_NS
from air_transfer.core.scan import Scan, Source, Stamp, scan
from tests.support.rewriters import CHANGED, RewriteOnce, local_scan, make_source, read_all, rewrite


def stored(tmp_path: Path) -> tuple[bytes, Source, Scan]:
    """``make_source``'s files, their bytes, and the directory read as node storage
    reads a stored checkpoint (confined to ``tmp_path``), scanned."""
    src = make_source(tmp_path)
    body = b"".join((src / n).read_bytes() for n in ("a.bin", "w.bin", "z.bin"))
    source = ConfinedSource(pafs.LocalFileSystem(), str(src), storage_root=str(tmp_path))
    return body, source, scan(source)


def link_and_unlink(where: str, span: Span) -> None:
    """Hook: what later incremental saves and ``num_to_keep`` do to a stored file
    (another checkpoint hard-links it, then one is deleted), while ``w.bin`` is read."""
    if (
        where.endswith("/w.bin")
        and span.file_offset >= 8 * KiB
        and not os.path.exists(where + ".later2")
    ):
        os.link(where, where + ".later")
        os.link(where, where + ".later2")
        os.unlink(where + ".later")


@pytest.mark.parametrize("node_storage", [True, False], ids=["node storage", "user source"])
def test_a_link_made_and_dropped_while_read_fails_only_a_users_source(
    tmp_path: Path, in_driver: Callable[[Any], None], node_storage: bool
) -> None:
    """Node storage never writes a file in place (every write replaces it), so a
    stored file's link count and ctime change only with its other names: its read
    goes on, bit-identical. A user's directory keeps the whole proof (a dropped link
    count is how a file renamed over while open is seen)."""
    body, source, scanned = stored(tmp_path)
    if not node_storage:
        source, scanned = local_scan(tmp_path / "src")
    in_driver(link_and_unlink)
    if node_storage:
        assert read_all(source, scanned) == body
        assert os.stat(tmp_path / "src" / "w.bin").st_nlink == 2  # it happened
    else:
        with pytest.raises(SourceChangedError, match="ctime_ns/nlink differ"):
            read_all(source, scanned)


def test_a_stored_file_rewritten_in_place_or_replaced_is_still_a_change(
    tmp_path: Path, in_driver: Callable[[Any], None]
) -> None:
    """What reads of node storage still compare: size, mtime, and the inode (a file
    replaced before it is opened; one replaced once open is read as scanned)."""
    (tmp_path / "in-place").mkdir()
    _, source, scanned = stored(tmp_path / "in-place")
    in_driver(RewriteOnce("w.bin", "in-place", 8 * KiB))
    with pytest.raises(SourceChangedError, match=CHANGED):
        read_all(source, scanned)
    in_driver(None)
    _, source, scanned = stored(tmp_path)
    rewrite(str(tmp_path / "src" / "w.bin"), "rename")
    with pytest.raises(SourceChangedError, match=r"w\.bin' was replaced"):
        read_all(source, scanned)


def test_a_stored_file_deleted_before_it_is_opened_is_a_file_not_found_error(
    tmp_path: Path,
) -> None:
    """Its checkpoint was deleted: nothing else removes a stored file."""
    _, source, scanned = stored(tmp_path)
    (tmp_path / "src" / "z.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"z\.bin.*deleted"):
        read_all(source, scanned)


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
