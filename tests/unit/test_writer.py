"""chunks -> files: exact reproduction, atomic publish, merge, and refusals (no Ray)."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from air_transfer import ChecksumError, ManifestError
from air_transfer.config import MIN_CHUNK_BYTES
from air_transfer.core import merge
from air_transfer.core.writer import write_tree
from tests.support.packs import local_pack, no_staging_left
from tests.support.trees import (
    Link,
    assert_same_tree,
    build_manifest,
    file_contents,
    leftovers,
    rich_tree,
    tree_listing,
)


def test_reproduces_a_rich_tree(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    out = write_tree(manifest, chunks, tmp_path / "out")
    assert out == str(tmp_path / "out")
    assert_same_tree(src, tmp_path / "out")
    assert no_staging_left(tmp_path)


def test_creates_missing_parents_and_fills_an_empty_target(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    write_tree(manifest, chunks, tmp_path / "a" / "b" / "out")
    assert_same_tree(src, tmp_path / "a" / "b" / "out")
    (tmp_path / "empty_target").mkdir()
    write_tree(manifest, chunks, tmp_path / "empty_target")
    assert_same_tree(src, tmp_path / "empty_target")


def test_merges_into_an_existing_directory(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    target = tmp_path / "out"
    (target / "sub").mkdir(parents=True)
    (target / "keep.txt").write_bytes(b"mine")
    (target / "model.bin").write_bytes(b"old version")
    write_tree(manifest, chunks, target)
    listing = tree_listing(target)
    assert listing.pop("keep.txt")[2] == b"mine"
    assert listing == tree_listing(src)
    assert no_staging_left(tmp_path)


def test_a_corrupt_chunk_names_chunk_and_files_and_publishes_nothing(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src, chunk_bytes=20_000)
    bad = bytearray(chunks[1])
    bad[5] ^= 0xFF
    chunks[1] = bytes(bad)
    with pytest.raises(ChecksumError, match=r"chunk 1 of \d+ .*'model.bin'"):
        write_tree(manifest, chunks, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert no_staging_left(tmp_path)


def test_a_corrupt_chunk_leaves_an_existing_target_untouched(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    target = tmp_path / "out"
    target.mkdir()
    (target / "model.bin").write_bytes(b"previous")
    before = tree_listing(target)
    chunks[-1] = chunks[-1][:-1] + bytes([chunks[-1][-1] ^ 1])
    with pytest.raises(ChecksumError):
        write_tree(manifest, chunks, target)
    assert tree_listing(target) == before
    assert no_staging_left(tmp_path)


def test_verify_false_skips_checksums_but_not_lengths(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"abcd" * 256 + b"efgh" * 256)  # two chunks of MIN_CHUNK_BYTES
    manifest, _ = local_pack(src)
    write_tree(manifest, [b"ABCD" * 256, b"EFGH" * 256], tmp_path / "unchecked", verify=False)
    assert (tmp_path / "unchecked" / "f").read_bytes() == b"ABCD" * 256 + b"EFGH" * 256
    with pytest.raises(ChecksumError, match="1023 bytes, expected 1024"):
        write_tree(manifest, [b"abcd" * 256, b"e" * 1023], tmp_path / "short", verify=False)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([b"abcd" * 256], "ended after 1 of 2 chunks"),
        ([b"abcd" * 256, b"efgh" * 256, b"ijkl" * 256], "more chunks than the 2"),
    ],
)
def test_wrong_chunk_count_is_refused(tmp_path: Path, chunks: list, message: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "f").write_bytes(b"abcd" * 256 + b"efgh" * 256)
    manifest, _ = local_pack(src)
    with pytest.raises(ChecksumError, match=message):
        write_tree(manifest, chunks, tmp_path / "out")
    assert not (tmp_path / "out").exists() and no_staging_left(tmp_path)


def test_target_that_is_a_file_is_refused(tmp_path: Path) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    (tmp_path / "out").write_bytes(b"a file")
    with pytest.raises(NotADirectoryError, match="out"):
        write_tree(manifest, chunks, tmp_path / "out")
    assert (tmp_path / "out").read_bytes() == b"a file"


@pytest.mark.parametrize("clash", ["file_where_dir", "dir_where_file", "symlink_where_dir"])
def test_merge_that_changes_a_kind_is_refused_before_writing(tmp_path: Path, clash: str) -> None:
    src = rich_tree(tmp_path / "src")
    manifest, chunks = local_pack(src)
    target = tmp_path / "out"
    target.mkdir()
    if clash == "file_where_dir":
        (target / "sub").write_bytes(b"not a dir")
    elif clash == "dir_where_file":
        (target / "model.bin").mkdir()
    else:
        (tmp_path / "elsewhere").mkdir()
        os.symlink(tmp_path / "elsewhere", target / "sub")  # writes would follow it
    before = tree_listing(target)
    with pytest.raises(FileExistsError, match="cannot merge checkpoint into"):
        write_tree(manifest, chunks, target)
    assert tree_listing(target) == before
    if clash == "symlink_where_dir":
        assert os.listdir(tmp_path / "elsewhere") == []
    assert no_staging_left(tmp_path)


def test_errors_keep_an_errno_and_name_the_path(tmp_path: Path) -> None:
    """Every OSError the writer raises has an errno and a path."""
    body = bytes(range(256)) * 5  # two chunks: 1024 + 256 bytes
    manifest, chunks = build_manifest({"sub/f": body}, chunk_bytes=MIN_CHUNK_BYTES)
    with pytest.raises(ChecksumError) as corrupt:
        write_tree(manifest, [chunks[0], b"X" * 256], tmp_path / "out")
    assert (corrupt.value.errno, corrupt.value.filename) == (errno.EBADMSG, str(tmp_path / "out"))
    with pytest.raises(ChecksumError) as short:
        write_tree(manifest, chunks[:1], tmp_path / "out")
    assert (short.value.errno, short.value.filename) == (errno.EBADMSG, str(tmp_path / "out"))
    (tmp_path / "file").write_bytes(b"x")
    with pytest.raises(NotADirectoryError) as not_dir:
        write_tree(manifest, chunks, tmp_path / "file")
    assert (not_dir.value.errno, not_dir.value.filename) == (errno.ENOTDIR, str(tmp_path / "file"))
    (tmp_path / "clash" / "sub").mkdir(parents=True)
    (tmp_path / "clash" / "sub" / "f").mkdir()
    with pytest.raises(FileExistsError) as clash:
        write_tree(manifest, chunks, tmp_path / "clash")
    assert clash.value.errno == errno.EEXIST
    assert clash.value.filename == str(tmp_path / "clash" / "sub" / "f")


# -- no escape through a merge -----------------------------------------------------------
@pytest.mark.parametrize("first", ["s", "l"])
def test_merge_escape_through_two_valid_manifests_is_refused(tmp_path: Path, first: str) -> None:
    """``s -> .`` and ``l -> s/..`` are each inside their checkpoint; merged, ``l``
    leads to the target's parent, in either order."""
    links = {"s": Link("."), "l": Link("s/..")}
    second = "l" if first == "s" else "s"
    target = tmp_path / "out"
    write_tree(*build_manifest({first: links[first], "f": b"1"}), target)
    before = file_contents(target)
    with pytest.raises(ManifestError, match=rf"{str(target)!r}.*symlink 'l' -> 's/\.\.'"):
        write_tree(*build_manifest({second: links[second], "g": b"2"}), target)
    assert file_contents(target) == before
    assert leftovers(tmp_path) == []


def test_merge_escape_through_a_link_already_in_the_target_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "out"
    target.mkdir()
    os.symlink(".", target / "current")
    with pytest.raises(ManifestError, match=r"symlink 'l' -> 'current/\.\.' \(of the checkpoint"):
        write_tree(*build_manifest({"l": Link("current/.."), "f": b"1"}), target)
    assert file_contents(target) == {"current": "-> ."}
    assert leftovers(tmp_path) == []


def test_merge_keeps_links_that_led_outside_before_but_none_may_lead_through_them(
    tmp_path: Path,
) -> None:
    """The owner's own links out of the target (a dataset mount, say) are left alone;
    a checkpoint link through one of them is refused like any other escape."""
    target = tmp_path / "out"
    target.mkdir()
    os.symlink(str(tmp_path), target / "data")
    os.symlink("../elsewhere", target / "up")
    write_tree(*build_manifest({"f": b"1"}), target)
    assert file_contents(target) == {"data": f"-> {tmp_path}", "up": "-> ../elsewhere", "f": b"1"}
    with pytest.raises(ManifestError, match="symlink 'x' -> 'data/y'"):
        write_tree(*build_manifest({"x": Link("data/y")}), target)


def test_merge_brings_the_existing_tree_over_by_hard_links(tmp_path: Path) -> None:
    """The merged tree: every kept file is the same inode (nothing copied), kept
    directories and symlinks keep their modes and mtimes, the root its mode."""
    target = tmp_path / "out"
    (target / "kept" / "deep").mkdir(parents=True)
    (target / "kept" / "deep" / "a").write_bytes(b"a")
    (target / "kept" / "b").write_bytes(b"b")
    (target / "f").write_bytes(b"old f")
    os.symlink("kept/b", target / "link")
    os.chmod(target / "kept", 0o751)
    os.chmod(target, 0o705)
    os.utime(target / "kept", ns=(5, 7 * 10**17))
    inode = os.stat(target / "kept" / "deep" / "a").st_ino
    write_tree(*build_manifest({"f": b"new f", "new/g": b"g"}), target)
    assert file_contents(target) == {
        "kept": "", "kept/deep": "", "kept/deep/a": b"a", "kept/b": b"b",
        "f": b"new f", "link": "-> kept/b", "new": "", "new/g": b"g",
    }  # fmt: skip
    assert os.stat(target / "kept" / "deep" / "a").st_ino == inode
    assert stat.S_IMODE(os.stat(target / "kept").st_mode) == 0o751
    assert os.stat(target / "kept").st_mtime_ns == 7 * 10**17
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o705
    assert leftovers(tmp_path) == []


def test_merge_copies_where_hard_links_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out"
    (target / "kept").mkdir(parents=True)
    (target / "kept" / "a").write_bytes(b"a" * 100_000)
    os.chmod(target / "kept" / "a", 0o640)
    os.utime(target / "kept" / "a", ns=(1, 3 * 10**17))
    os.symlink("kept/a", target / "link")

    def no_links(*args: object, **kwargs: object) -> None:  # as protected_hardlinks does
        raise OSError(errno.EPERM, os.strerror(errno.EPERM))

    monkeypatch.setattr(merge.os, "link", no_links)
    write_tree(*build_manifest({"f": b"1"}), target)
    st = os.stat(target / "kept" / "a")
    assert (stat.S_IMODE(st.st_mode), st.st_mtime_ns) == (0o640, 3 * 10**17)
    assert file_contents(target) == {
        "kept": "", "kept/a": b"a" * 100_000, "link": "-> kept/a", "f": b"1",
    }  # fmt: skip


def test_a_target_that_is_a_link_to_a_directory_is_written_through(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "keep").write_bytes(b"k")
    os.symlink("real", tmp_path / "out")
    write_tree(*build_manifest({"f": b"1"}), tmp_path / "out")
    assert os.readlink(tmp_path / "out") == "real"
    assert file_contents(tmp_path / "real") == {"keep": b"k", "f": b"1"}
    os.symlink("missing", tmp_path / "dangling")
    with pytest.raises(NotADirectoryError):
        write_tree(*build_manifest({"f": b"1"}), tmp_path / "dangling")
    assert leftovers(tmp_path) == []
