"""A symlink swapped in mid-call never leads Ray Train's report and restore hooks, or
the storage sink, out of the storage root (the attacker: ``tests.support.attack``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray
from ray.train import Checkpoint

from air_transfer import ChunkedCheckpoint, TransferConfig, storage_filesystem
from air_transfer.storage.server.sink import store_checkpoint
from air_transfer.train.hooks import download_directory, upload_directory
from tests.support.attack import INSIDE, ITERATIONS, Attack, attacked, make_attack, no_secret


@pytest.fixture
def attack(tmp_path: Path) -> Attack:
    return make_attack(tmp_path)


@pytest.fixture
def local_checkpoint(tmp_path: Path) -> Path:
    """A worker's checkpoint directory (not in the storage)."""
    src = tmp_path / "worker" / "ckpt"
    (src / "sub").mkdir(parents=True)
    (src / "a").write_bytes(INSIDE)
    (src / "sub" / "b").write_bytes(INSIDE)
    return src


@pytest.mark.usefixtures("ray_local")
def test_train_report_on_the_storage_node_publishes_inside(
    attack: Attack, local_checkpoint: Path
) -> None:
    """Train's report hook on the storage node: checked, then ``write_tree`` by path."""
    fs, r = storage_filesystem(root=attack.r), attack.r
    published: list[int] = []

    def report(i: int) -> None:  # new targets, and merges into existing ones
        upload_directory(fs, f"{r}/d/exp/ck{i % 8}", Checkpoint(str(local_checkpoint)))
        published.append(i % 8)

    attacked(attack, report)
    for i in published:
        assert (attack.d / "exp" / f"ck{i}" / "sub" / "b").read_bytes() == INSIDE


@pytest.mark.usefixtures("ray_local")
def test_the_storage_sink_publishes_inside(attack: Attack, local_checkpoint: Path) -> None:
    """The sink (a report from another node, ``checkpoint_upload_fn``): checked, then
    the transfer written by path."""
    fs, r = storage_filesystem(root=attack.r), attack.r
    handle = ChunkedCheckpoint.from_directory(local_checkpoint).pack()
    published: list[int] = []

    def store(i: int) -> None:
        store_checkpoint(handle, fs, f"{r}/d/exp/s{i % 8}")
        published.append(i % 8)

    attacked(attack, store, ITERATIONS // 5)
    for i in published:
        assert (attack.d / "exp" / f"s{i}" / "sub" / "b").read_bytes() == INSIDE


@pytest.mark.usefixtures("ray_local")
def test_train_restore_on_the_storage_node_reads_inside(attack: Attack, tmp_path: Path) -> None:
    """Train's restore hook on the storage node: checked, then ``copy_tree`` by path."""
    fs, r = storage_filesystem(root=attack.r), attack.r
    assert ray.is_initialized()

    def restore(i: int) -> None:
        target = tmp_path / "restored" / str(i)
        if download_directory(fs, f"{r}/d/ckpt", str(target)):
            no_secret([str(p) for p in target.rglob("*")])
            for p in target.rglob("*"):
                if p.is_file():
                    no_secret(p.read_bytes())

    attacked(attack, restore)


@pytest.mark.usefixtures("ray_local")
def test_a_report_into_the_storage_root_itself_is_refused(
    attack: Attack, local_checkpoint: Path
) -> None:
    """Defect: a checkpoint written at the root itself was staged and swapped in from
    the root's parent directory, outside the root."""
    fs, parent = storage_filesystem(root=attack.r), attack.root.parent
    before = sorted(os.listdir(parent))
    with pytest.raises(PermissionError, match="storage root"):
        upload_directory(fs, attack.r, Checkpoint(str(local_checkpoint)))
    assert sorted(os.listdir(parent)) == before


@pytest.mark.usefixtures("ray_local")
def test_a_refused_report_names_the_storage_path(attack: Attack, local_checkpoint: Path) -> None:
    """The writer works through a held directory (``/proc/self/fd/...``): its errors
    still name the path in the storage."""
    fs = storage_filesystem(root=attack.r)
    with pytest.raises(NotADirectoryError) as caught:
        upload_directory(fs, f"{attack.r}/d/f", Checkpoint(str(local_checkpoint)))
    assert f"{attack.r}/d/f" in str(caught.value) and "/proc/" not in str(caught.value)


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("direct_io", [True, False])
def test_a_same_node_write_creates_nothing_outside(attack: Attack, direct_io: bool) -> None:
    """The staging file was created confined, then opened again by path (``O_CREAT``
    with direct I/O): a flip in between created it outside and wrote there. Here
    through ``storage_filesystem`` on the storage node itself (the same-node writer)."""
    r = attack.r
    fs = storage_filesystem(config=TransferConfig(direct_io=direct_io), root=r)
    written: list[int] = []

    def write(i: int) -> None:
        with fs.open_output_stream(f"{r}/d/exp/new{i}") as f:
            f.write(INSIDE)
        written.append(i)

    attacked(attack, write, 3 * ITERATIONS)  # quick calls, with a narrow window each
    for i in written:
        assert (attack.d / "exp" / f"new{i}").read_bytes() == INSIDE
