"""Node storage's metadata with a durable tier behind it (``storage.server.drain.tiered``,
no Ray): a path held only in the tier is found and listed, a pending delete hides it,
a delete of it is noted and succeeds once, a move of it is refused clearly, and node
storage's own errors are the ones a caller gets whatever the tier holds."""

from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from air_transfer.storage.durable.tombstones import MemoryTombstones
from air_transfer.storage.server.drain.tiered import TieredDisk
from air_transfer.storage.server.metadata import DiskStorage
from tests.support.drains import SMALL, drained, local_target
from tests.support.trees import write_file


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[tuple[TieredDisk, str, Path]]:
    root = tmp_path / "root"
    write_file(root / "run" / "old" / "a.bin", b"a" * 100)
    write_file(root / "run" / "file", b"f")
    (root / "run" / "dir").mkdir()
    disk = TieredDisk(DiskStorage())
    disk.attach(str(root), local_target(tmp_path / "durable"), SMALL, None, MemoryTombstones())
    tier = disk.tier(str(root))
    assert tier is not None
    drained(tier.drainer)
    yield disk, str(root), tmp_path
    disk.stop()


def test_paths_held_only_in_the_tier_are_found_listed_and_deleted_once(
    tiered: tuple[TieredDisk, str, Path],
) -> None:
    disk, root, tmp = tiered
    (Path(root) / "run" / "old" / "a.bin").unlink()  # as on a new cluster's empty disk
    (Path(root) / "run" / "old").rmdir()
    [(ftype, size, _)] = disk.fs_info(root, [f"{root}/run/old/a.bin"])
    assert (ftype, size) == (pafs.FileType.File, 100)
    listed = {e[0] for e in disk.fs_list(root, f"{root}/run", True, False)}
    assert {"old", "old/a.bin", "file", "dir"} <= listed
    disk.fs_delete_dir(root, f"{root}/run/old")  # held in the tier alone: noted, done
    assert disk.fs_info(root, [f"{root}/run/old"])[0][0] == pafs.FileType.NotFound
    with pytest.raises(FileNotFoundError):
        disk.fs_delete_dir(root, f"{root}/run/old")  # once, as LocalFileSystem
    tier = disk.tier(root)
    assert tier is not None
    drained(tier.drainer)
    assert not (tmp / "durable" / "run" / "old").exists()


def test_a_move_raises_node_storages_error_and_refuses_a_tier_only_source(
    tiered: tuple[TieredDisk, str, Path],
) -> None:
    disk, root, _ = tiered
    with pytest.raises(IsADirectoryError):
        disk.fs_move(root, f"{root}/run/file", f"{root}/run/dir")
    with pytest.raises(FileNotFoundError):
        disk.fs_move(root, f"{root}/run/nope", f"{root}/run/x")
    (Path(root) / "run" / "old" / "a.bin").unlink()
    with pytest.raises(OSError) as refused:
        disk.fs_move(root, f"{root}/run/old/a.bin", f"{root}/run/b.bin")
    assert refused.value.errno == errno.ENOTSUP and "durable tier" in str(refused.value)
