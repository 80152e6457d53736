"""Directory scanning and the chunk layout (no Ray)."""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from air_transfer import ManifestError, SourceChangedError
from air_transfer.core.plan import chunk_count, iter_chunk_spans
from air_transfer.core.proven_read import read_chunks
from air_transfer.core.readahead import read_chunks_ahead
from air_transfer.core.scan import Scan, Source, scan


@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5000), max_size=40),
    chunk_bytes=st.integers(min_value=1, max_value=3000),
)
def test_spans_cover_every_byte_exactly_once(sizes: list[int], chunk_bytes: int) -> None:
    total = sum(sizes)
    covered = [0] * total
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    chunks = list(iter_chunk_spans(sizes, chunk_bytes))
    assert len(chunks) == chunk_count(total, chunk_bytes)
    for index, spans in enumerate(chunks):
        chunk_len = min(chunk_bytes, total - index * chunk_bytes)
        assert sum(s.length for s in spans) == chunk_len
        cursor = 0
        for s in spans:
            assert s.length > 0 and s.chunk_offset == cursor  # in order, no gap
            assert s.file_offset >= 0 and s.file_offset + s.length <= sizes[s.file_index]
            cursor += s.length
            for b in range(
                starts[s.file_index] + s.file_offset,
                starts[s.file_index] + s.file_offset + s.length,
            ):
                covered[b] += 1
                assert b // chunk_bytes == index
    assert all(c == 1 for c in covered)


def test_spans_can_start_mid_stream() -> None:
    sizes = [5, 0, 7, 3]
    assert list(iter_chunk_spans(sizes, 4, start_chunk=2)) == list(iter_chunk_spans(sizes, 4))[2:]


def test_scan_lists_parents_first_with_modes_and_links(tmp_path: Path) -> None:
    (tmp_path / "b" / "c").mkdir(parents=True)
    (tmp_path / "b" / "c" / "f").write_bytes(b"123")
    (tmp_path / "a").write_bytes(b"")
    os.chmod(tmp_path / "a", 0o640)
    os.symlink("b/c/f", tmp_path / "l")
    os.symlink(str(tmp_path / "b" / "c" / "f"), tmp_path / "abs")  # absolute but inside
    entries = {e.path: e for e in scan(Source(pafs.LocalFileSystem(), str(tmp_path))).entries}
    assert list(entries) == ["a", "abs", "b", "b/c", "b/c/f", "l"]
    assert entries["a"].mode == 0o640 and entries["b/c/f"].size == 3
    assert entries["l"].target == "b/c/f"
    assert entries["abs"].target == "b/c/f"  # stored relative so it resolves anywhere


def test_missing_source_and_file_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        scan(Source(pafs.LocalFileSystem(), str(tmp_path / "nope")))
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        scan(Source(pafs.LocalFileSystem(), str(tmp_path / "f")))


def test_scan_refuses_a_path_over_path_max(tmp_path: Path) -> None:
    """The one manifest limit a directory can exceed is checked by the walk itself,
    so that the call that scans raises it (the manifest is made later, elsewhere);
    a file whose path is just within it is listed, and the stamps follow the files."""
    name = "d" * 250
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        for _ in range(16):  # relative steps: the full path may pass PATH_MAX
            os.mkdir(name, dir_fd=fd)
            sub = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = sub
        ok = "f" * (4095 - 16 * 251)
        os.close(os.open(ok, os.O_CREAT | os.O_WRONLY, dir_fd=fd))
        found = scan(Source(pafs.LocalFileSystem(), str(tmp_path)))
        assert [len(f.path.encode()) for f in found.files] == [4095]
        assert found.stamps[0].size == 0 and found.total_bytes == 0
        os.close(os.open(ok + "g", os.O_CREAT | os.O_WRONLY, dir_fd=fd))
    finally:
        os.close(fd)
    with pytest.raises(ManifestError, match=r"4096 bytes long.*PATH_MAX"):
        scan(Source(pafs.LocalFileSystem(), str(tmp_path)))


def test_symlink_outside_is_refused_unless_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"secret")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.symlink(outside, ckpt / "escape")
    with pytest.raises(ManifestError, match=r"escape.*points outside the checkpoint"):
        scan(Source(pafs.LocalFileSystem(), str(ckpt)))
    entries = scan(Source(pafs.LocalFileSystem(), str(ckpt)), follow_symlinks=True).entries
    assert [(e.path, e.kind, e.size) for e in entries] == [("escape", "file", 6)]


def test_symlink_loop_through_followed_links_is_refused(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    os.symlink(tmp_path, ckpt / "up")  # the parent: contains ckpt again
    with pytest.raises(ManifestError, match="loop"):
        scan(Source(pafs.LocalFileSystem(), str(ckpt)), follow_symlinks=True)


def test_a_followed_link_to_a_directory_is_walked_and_the_scan_comes_back(
    tmp_path: Path,
) -> None:
    """A followed symlink to a directory outside is listed as the directory it leads
    to, with everything under it; the walk then comes back to the link's directory
    (not through the target's ``..``) and lists what follows it."""
    (tmp_path / "outside" / "sub").mkdir(parents=True)
    (tmp_path / "outside" / "sub" / "f").write_bytes(b"abc")
    ckpt = tmp_path / "ckpt"
    (ckpt / "d").mkdir(parents=True)
    os.symlink(tmp_path / "outside", ckpt / "d" / "ext")
    (ckpt / "d" / "z").write_bytes(b"zz")
    (ckpt / "z").write_bytes(b"")
    entries = scan(Source(pafs.LocalFileSystem(), str(ckpt)), follow_symlinks=True).entries
    assert [(e.path, e.kind, e.size) for e in entries] == [
        ("d", "dir", 0), ("d/ext", "dir", 0), ("d/ext/sub", "dir", 0),
        ("d/ext/sub/f", "file", 3), ("d/z", "file", 2), ("z", "file", 0),
    ]  # fmt: skip


def test_a_directory_moved_out_while_scanned_is_a_source_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The scan is in ``a/b`` when ``b`` is moved out of ``a``: going back up, ``..``
    is not the directory it came down from, and the scan says the source changed
    (naming the directory) instead of listing another tree."""
    from air_transfer.core import dirtree

    (tmp_path / "src" / "a" / "b").mkdir(parents=True)
    (tmp_path / "src" / "a" / "b" / "f").write_bytes(b"x")
    (tmp_path / "src" / "c").write_bytes(b"y")
    listdir, moved = dirtree._listdir, []

    def listdir_then_move(cursor: dirtree.DirCursor, ordered: bool = False) -> list[str]:
        names = listdir(cursor, ordered)
        if cursor.here().endswith("a/b") and not moved:
            moved.append(os.rename(tmp_path / "src" / "a" / "b", tmp_path / "b"))
        return names

    monkeypatch.setattr(dirtree, "_listdir", listdir_then_move)
    with pytest.raises(SourceChangedError, match=f"scanned.*{tmp_path / 'src' / 'a' / 'b'}"):
        scan(Source(pafs.LocalFileSystem(), str(tmp_path / "src")))
    assert moved, "the move never happened mid-scan"


def test_a_file_deleted_while_scanned_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file listed, then deleted before the scan looks at it: the scan fails naming
    it, never lists less than the tree (a walk that skips what vanished would)."""
    from air_transfer.core import dirtree

    (tmp_path / "a").write_bytes(b"x")
    (tmp_path / "b").write_bytes(b"y")
    listdir = dirtree._listdir

    def listdir_then_delete(cursor: dirtree.DirCursor, ordered: bool = False) -> list[str]:
        names = listdir(cursor, ordered)
        os.remove(tmp_path / "b")
        return names

    monkeypatch.setattr(dirtree, "_listdir", listdir_then_delete)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "b")):
        scan(Source(pafs.LocalFileSystem(), str(tmp_path)))


def test_special_files_are_refused(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(ManifestError, match=r"pipe.*socket, FIFO or device"):
        scan(Source(pafs.LocalFileSystem(), str(tmp_path)))


def test_scan_and_read_through_any_pyarrow_filesystem() -> None:
    fs = pafs._MockFileSystem()
    fs.create_dir("bucket/ckpt/sub")
    with fs.open_output_stream("bucket/ckpt/sub/w.bin") as f:
        f.write(b"abcdefghij")
    with fs.open_output_stream("bucket/ckpt/x") as f:
        f.write(b"XY")
    source = Source(fs, "bucket/ckpt")
    scanned = scan(source)
    assert [(e.path, e.kind, e.size) for e in scanned.entries] == [
        ("sub", "dir", 0),
        ("sub/w.bin", "file", 10),
        ("x", "file", 2),
    ]
    bufs = {}
    chunks = read_chunks(
        source,
        scanned.files,
        scanned.stamps,
        4,
        lambda i, n: memoryview(bufs.setdefault(i, bytearray(n))),
    )
    assert [bytes(v) for _, v in chunks] == [b"abcd", b"efgh", b"ijXY"]


def _local(tmp_path: Path) -> tuple[Source, Scan]:
    source = Source(pafs.LocalFileSystem(), str(tmp_path))
    return source, scan(source)


@pytest.mark.parametrize("change", ["shrink", "grow", "vanish"])
def test_a_file_changing_after_the_scan_is_an_error(tmp_path: Path, change: str) -> None:
    (tmp_path / "a").write_bytes(b"a" * 100)
    (tmp_path / "b").write_bytes(b"b" * 100)
    source, scanned = _local(tmp_path)
    if change == "shrink":
        (tmp_path / "a").write_bytes(b"a" * 50)
    elif change == "grow":
        (tmp_path / "a").write_bytes(b"a" * 150)
    else:
        (tmp_path / "a").unlink()
    words = {"shrink": "shrank", "grow": "grew", "vanish": "vanished"}
    with pytest.raises(SourceChangedError, match=f"{tmp_path / 'a'}.*{words[change]}"):
        list(read_chunks_ahead(source, scanned.files, scanned.stamps, 64))


def test_read_ahead_yields_the_stream_in_order(tmp_path: Path) -> None:
    data = os.urandom(10_000)
    (tmp_path / "a").write_bytes(data[:3_000])
    (tmp_path / "b").write_bytes(data[3_000:])
    source, s = _local(tmp_path)
    got = b"".join(bytes(view) for _, view, _ in read_chunks_ahead(source, s.files, s.stamps, 1024))
    assert got == data


def test_read_ahead_stops_cleanly_when_abandoned(tmp_path: Path) -> None:
    """A caller that stops after the first of ten chunks: closing the generator ends
    the read-ahead thread (it was waiting to hand over the next chunk) promptly."""
    (tmp_path / "a").write_bytes(os.urandom(10_000))
    source, s = _local(tmp_path)
    before = set(threading.enumerate())
    gen = read_chunks_ahead(source, s.files, s.stamps, 1024)
    next(gen)
    (reader,) = [t for t in threading.enumerate() if t not in before]
    assert reader.name == "air-transfer-pack" and reader.is_alive()
    closer = threading.Thread(target=gen.close, daemon=True)
    closer.start()
    closer.join(timeout=30)
    assert not closer.is_alive(), "closing the generator hung: the reader ignored the stop"
    assert not reader.is_alive(), "the read-ahead thread outlived the generator"


def test_a_1200_level_tree_scans_without_recursion(tmp_path: Path) -> None:
    """Deep trees: the walk was one Python frame per level."""
    depth = 1200
    assert depth > sys.getrecursionlimit()
    deepest = str(tmp_path)
    for _ in range(depth):  # not os.makedirs: it recurses per level too
        deepest = os.path.join(deepest, "d")
        os.mkdir(deepest)
    Path(deepest, "f").write_bytes(b"leaf")
    Path(tmp_path, "e").write_bytes(b"")  # a sibling after the tree, in name order
    try:
        scanned = scan(Source(pafs.LocalFileSystem(), str(tmp_path)))
        assert [e.path for e in scanned.entries] == [
            *("/".join(["d"] * n) for n in range(1, depth + 1)),
            "/".join(["d"] * depth + ["f"]),
            "e",
        ]
        assert [f.path for f in scanned.files] == [scanned.entries[-2].path, "e"]
        assert scanned.stamps[0].size == 4
    finally:
        # pytest's own cleanup (shutil.rmtree) recurses per level: remove bottom-up.
        os.remove(os.path.join(deepest, "f"))
        for n in range(depth, 0, -1):
            os.rmdir(os.path.join(tmp_path, *["d"] * n))
