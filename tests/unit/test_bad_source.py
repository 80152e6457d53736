"""A source that is not a directory is refused before anything is packed, naming
the path (no Ray: nothing reaches the cluster). The rest of the bad input, which
needs a transfer, is in ``tests/ray/test_bad_input.py``."""

from __future__ import annotations

from pathlib import Path

import pytest

from air_transfer import ChunkedCheckpoint


def test_missing_source(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope"):
        ChunkedCheckpoint.from_directory(tmp_path / "nope").to_object_ref()


def test_file_instead_of_directory(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"x")
    with pytest.raises(NotADirectoryError, match=r"'.*/f' is not a directory"):
        ChunkedCheckpoint.from_directory(tmp_path / "f").to_object_ref()
