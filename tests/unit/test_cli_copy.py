"""``air-transfer cp``'s copy between two pyarrow filesystems, without Ray: the tree
arrives byte for byte (empty files and directories too), the files that make a
checkpoint whole go last, a source that fails mid-file leaves nothing of that file
at the destination, a destination that exists is refused unless ``--overwrite``, and
a copy that differs when read back is an error naming the file."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from air_transfer.cli.copy import check_copy, copy_between, plan
from air_transfer.cli.trees import read_sums
from tests.support.recording_fs import RecordingHandler

LOCAL = pafs.LocalFileSystem()


def make_run(top: Path) -> dict[str, bytes]:
    """A run directory: a DCP checkpoint, a Train checkpoint, Train's run state."""
    files = {
        "checkpoint_000000/__0_0.distcp": os.urandom(3 << 20),
        "checkpoint_000000/__1_0.distcp": os.urandom(1 << 20),
        "checkpoint_000000/.metadata": b"dcp metadata",
        "checkpoint_000001/model.bin": os.urandom((32 << 20) + 5),  # two 32 MiB chunks
        "checkpoint_000001/empty": b"",
        "checkpoint_manager_snapshot.json": b"{}",
    }
    for rel, data in files.items():
        (top / rel).parent.mkdir(parents=True, exist_ok=True)
        (top / rel).write_bytes(data)
    (top / "checkpoint_000001" / "logs").mkdir()  # an empty directory
    return files


def tree(top: Path) -> dict[str, bytes | None]:
    return {
        str(p.relative_to(top)): (p.read_bytes() if p.is_file() else None)
        for p in sorted(top.rglob("*"))
    }


def test_a_run_is_copied_whole_and_its_markers_last(tmp_path: Path) -> None:
    src, dst = tmp_path / "run", tmp_path / "copy" / "run"
    make_run(src)
    recording = RecordingHandler()
    fs = pafs.PyFileSystem(recording)
    planned = plan(LOCAL, str(src), fs, str(dst), overwrite=False)
    counted: list[int] = []
    sums = copy_between(LOCAL, str(src), fs, str(dst), planned, counted.append)
    done = check_copy(fs, str(dst), sums, str(src))
    assert tree(dst) == tree(src)
    assert (done.files, done.nbytes, sum(counted)) == (6, planned.nbytes, planned.nbytes)
    names = [os.path.basename(p) for p in recording.published]
    assert sorted(names[-2:]) == [".metadata", "checkpoint_manager_snapshot.json"]
    assert len(names) == 6
    assert not [p for p in tree(tmp_path / "copy") if ".air-cp-" in p]


def test_one_file_into_a_new_directory(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"m" * 1000)
    dst = tmp_path / "new" / "dir" / "model.bin"
    planned = plan(LOCAL, str(tmp_path / "model.bin"), LOCAL, str(dst), overwrite=False)
    sums = copy_between(LOCAL, str(tmp_path / "model.bin"), LOCAL, str(dst), planned)
    check_copy(LOCAL, str(dst), sums, "model.bin")
    assert dst.read_bytes() == b"m" * 1000


def test_an_existing_destination_is_refused_unless_overwrite(tmp_path: Path) -> None:
    src, dst = tmp_path / "run", tmp_path / "dst"
    make_run(src)
    dst.mkdir()
    (dst / "mine").write_bytes(b"kept")
    with pytest.raises(FileExistsError, match="exists; pass --overwrite"):
        plan(LOCAL, str(src), LOCAL, str(dst), overwrite=False)
    with pytest.raises(NotADirectoryError):
        plan(LOCAL, str(src), LOCAL, str(dst / "mine"), overwrite=True)
    planned = plan(LOCAL, str(src), LOCAL, str(dst), overwrite=True)
    check_copy(LOCAL, str(dst), copy_between(LOCAL, str(src), LOCAL, str(dst), planned), str(src))
    assert tree(dst) == {**tree(src), "mine": b"kept"}


class Breaking(io.RawIOBase):
    """A file whose second read fails (a disk or a connection gone mid-file)."""

    def __init__(self, data: bytes) -> None:
        super().__init__()
        self.data, self.reads = data, 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        self.reads += 1
        if self.reads > 1:
            raise OSError(5, "Input/output error (injected)", "model.bin")
        return self.data[: size if size >= 0 else None]


class BreakingSource(RecordingHandler):
    def open_input_stream(self, path: str) -> Any:
        if path.endswith("model.bin"):
            return pa.PythonFile(Breaking(Path(path).read_bytes()), mode="r")
        return super().open_input_stream(path)


@pytest.mark.parametrize("dst_kind", ["local", "recording"])
def test_a_file_whose_source_fails_midway_leaves_nothing(tmp_path: Path, dst_kind: str) -> None:
    src, dst = tmp_path / "run", tmp_path / "dst"
    make_run(src)
    source = pafs.PyFileSystem(BreakingSource())
    target = LOCAL if dst_kind == "local" else pafs.PyFileSystem(RecordingHandler())
    planned = plan(source, str(src), target, str(dst), overwrite=False)
    with pytest.raises(OSError, match="injected"):
        copy_between(source, str(src), target, str(dst), planned)
    assert not (dst / "checkpoint_000001" / "model.bin").exists()
    assert not [p for p in tree(dst) if ".air-cp-" in p]  # its temporary name removed


def test_a_copy_that_reads_back_different_is_an_error(tmp_path: Path) -> None:
    src, dst = tmp_path / "run", tmp_path / "dst"
    make_run(src)
    planned = plan(LOCAL, str(src), LOCAL, str(dst), overwrite=False)
    sums = copy_between(LOCAL, str(src), LOCAL, str(dst), planned)
    shard = dst / "checkpoint_000000" / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[12345] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(OSError, match=r"1 file\(s\) read back .* differ .*__1_0\.distcp"):
        check_copy(LOCAL, str(dst), sums, str(src))
    assert read_sums(LOCAL, str(shard)).size == 1 << 20
