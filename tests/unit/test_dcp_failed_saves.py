"""``NodeStorageWriter``'s failed saves without Ray, over a pyarrow filesystem on this
disk whose file streams fail on cue (``Failing``: what node storage's stream raises
when the storage node's agent dies): the error a save raises is the stream's,
saying to save again, never torch's later "unexpected pos"; a save that fails over
an existing checkpoint, writing a shard or renaming its metadata, leaves that
checkpoint whole; a save that succeeds replaces it and deletes its files."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import torch
import torch.distributed.checkpoint as dcp

from air_transfer.dcp import NodeStorageReader, NodeStorageWriter
from air_transfer.dcp.train import _unwrapped

pytestmark = [
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
    pytest.mark.filterwarnings("ignore:Detected an existing checkpoint"),
]


class Failing(io.RawIOBase):
    """A file whose writes raise ConnectionError past ``limit`` bytes."""

    def __init__(self, path: str, limit: int) -> None:
        super().__init__()
        self.file, self.written, self.limit = open(path, "wb"), 0, limit

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self.written += len(memoryview(data))
        if self.written > self.limit:
            raise ConnectionError("the storage node's agent died")
        return self.file.write(data)

    def close(self) -> None:
        self.file.close()
        super().close()


class FailingFiles(pafs.FileSystemHandler):
    """This disk, but a ``.distcp`` stream fails past ``limit`` bytes and a move onto
    ``.metadata`` fails when ``fail_publish``."""

    def __init__(self, limit: int = 1 << 40, fail_publish: bool = False) -> None:
        self.local, self.limit, self.fail_publish = pafs.LocalFileSystem(), limit, fail_publish

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def get_type_name(self) -> str:
        return "failing-local"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> Any:
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> Any:
        return self.local.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.local.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise PermissionError("not in a test")

    def delete_file(self, path: str) -> None:
        self.local.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        if self.fail_publish and dest.endswith("/.metadata"):
            raise ConnectionError("the storage node's agent died")
        self.local.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.local.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        return self.local.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.local.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any = None) -> Any:
        limit = self.limit if path.endswith(".distcp") else 1 << 40
        return pa.PythonFile(Failing(path, limit), mode="w")

    def open_append_stream(self, path: str, metadata: Any = None) -> Any:
        raise NotImplementedError


def state(version: int) -> dict[str, Any]:
    return {f"t{i}": torch.full((64, 1024), float(10 * version + i)) for i in range(4)} | {
        "step": version
    }


def save(path: Path, version: int, handler: FailingFiles | None = None) -> None:
    fs = pafs.PyFileSystem(handler or FailingFiles())
    writer = NodeStorageWriter(str(path), fs)
    _unwrapped(lambda: dcp.save(state(version), storage_writer=writer, no_dist=True))


def loads(path: Path, version: int) -> bool:
    got = {k: torch.zeros(64, 1024) if k != "step" else -1 for k in state(0)}
    reader = NodeStorageReader(str(path), pafs.LocalFileSystem())
    _unwrapped(lambda: dcp.load(got, storage_reader=reader, no_dist=True))
    expected = state(version)
    return got["step"] == version and all(
        torch.equal(got[k], v) for k, v in expected.items() if isinstance(v, torch.Tensor)
    )


@pytest.mark.parametrize("limit", [0, 5_000, 200_000], ids=["header", "a record", "a tensor"])
def test_a_failed_write_is_the_streams_error_saying_to_save_again(
    tmp_path: Path, limit: int
) -> None:
    """torch.save hides a failed write of a record and fails later on its own
    ("unexpected pos 704 vs 598"): the stream's error is what the save raises."""
    with pytest.raises(ConnectionError) as failed:
        save(tmp_path / "ckpt", 1, FailingFiles(limit))
    message = str(failed.value)
    assert "agent died" in message and "save it again" in message, message
    assert "__0_0.distcp" in message and "unexpected pos" not in message


def test_a_save_failing_over_a_checkpoint_leaves_it_whole(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    save(path, 1)
    old = set(os.listdir(path))
    with pytest.raises(ConnectionError):
        save(path, 2, FailingFiles(200_000))  # its shard half written
    assert loads(path, 1) and old <= set(os.listdir(path))
    with pytest.raises(ConnectionError):
        save(path, 3, FailingFiles(fail_publish=True))  # every shard written
    assert loads(path, 1)  # the metadata stayed until a new one replaced it
    save(path, 4)
    assert loads(path, 4)
    assert not old & set(os.listdir(path)) - {".metadata"}  # version 1's files went
