"""The one recursive listing (``core.fs_listing``): the same relative paths from any
pyarrow filesystem, however it names what it lists, and pyarrow's errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow.fs as pafs
import pytest

from air_transfer.core.fs_listing import list_below

TREE = {"a": b"1", "d/b": b"22", "d/e/c": b"333"}


def _write(fs: pafs.FileSystem, top: str) -> None:
    for rel, body in TREE.items():
        fs.create_dir(f"{top}/{rel}".rsplit("/", 1)[0], recursive=True)
        with fs.open_output_stream(f"{top}/{rel}") as out:
            out.write(body)


@pytest.mark.parametrize("kind", ["local", "mock"])
@pytest.mark.parametrize("slash", ["", "/"])
def test_every_entry_relative_to_the_listed_directory(
    tmp_path: Path, kind: str, slash: str
) -> None:
    # The mock filesystem names paths without a leading "/", the local one with it.
    fs = pafs.LocalFileSystem() if kind == "local" else pafs._MockFileSystem()
    top = str(tmp_path / "top") if kind == "local" else "bucket/top"
    _write(fs, top)
    listed = {rel: info.size for rel, info in list_below(fs, top + slash)}
    assert listed == {"a": 1, "d": None, "d/b": 2, "d/e": None, "d/e/c": 3}


def test_what_is_not_a_directory(tmp_path: Path) -> None:
    fs = pafs.LocalFileSystem()
    _write(fs, str(tmp_path))
    assert list_below(fs, str(tmp_path / "gone"), missing_ok=True) == []
    with pytest.raises(FileNotFoundError):
        list_below(fs, str(tmp_path / "gone"))
    with pytest.raises(NotADirectoryError):
        list_below(fs, str(tmp_path / "a"))
