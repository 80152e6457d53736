"""``air_transfer.dcp``'s writer and reader in one process (``no_dist=True``), over
pyarrow's LocalFileSystem (no Ray) and over node storage on this node: what DCP
saves loads back exactly (tensors, optimizer state, plain values), and a bad
checkpoint raises a clear error with the state dict untouched.

The cluster cases (other nodes, process groups, resharding, Ray Train) are in
``integration_tests/test_dcp*.py``.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import resource
import signal
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import torch
import torch.distributed.checkpoint as dcp
from ray.train import Checkpoint
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

import air_transfer
from air_transfer.dcp import NodeStorageReader, NodeStorageWriter, load

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(params=["local", "node-storage"])
def fs(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[pafs.FileSystem]:
    """pyarrow's own local filesystem, and node storage on this (the storage) node,
    rooted at the test's directory."""
    if request.param == "local":
        yield pafs.LocalFileSystem()
    else:
        request.getfixturevalue("ray_local")
        yield air_transfer.storage_filesystem(root=str(tmp_path))


def trained(seed: int) -> dict[str, Any]:
    """A small model and its Adam state after one step, a step count and a note."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 256)).sum().backward()
    optimizer.step()
    return {
        "model": model.state_dict(),
        "optim": optimizer.state_dict(),
        "step": seed,
        "note": f"seed {seed}",
    }


def flat(state: dict[str, Any]) -> dict[str, Any]:
    """Every leaf by its path, tensors cloned: what a state dict holds right now."""
    out: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}", v)
        elif isinstance(value, torch.Tensor):
            out[prefix] = value.clone()
        else:
            out[prefix] = value

    walk("", state)
    return out


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a.keys() != b.keys():
        return False
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            if not (isinstance(b[k], torch.Tensor) and torch.equal(v, b[k])):
                return False
        elif v != b[k]:
            return False
    return True


def saved(fs: pafs.FileSystem, path: Path, seed: int = 1) -> dict[str, Any]:
    state = trained(seed)
    dcp.save(state, storage_writer=NodeStorageWriter(str(path), fs), no_dist=True)
    return flat(state)


def test_a_state_dict_round_trips_with_its_optimizer_state_and_plain_values(
    fs: pafs.FileSystem, tmp_path: Path
) -> None:
    expected = saved(fs, tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path / "ckpt")) == [".metadata", "__0_0.distcp"]
    state = trained(2)
    assert not same(flat(state), expected)
    assert load(state, Checkpoint(str(tmp_path / "ckpt"), filesystem=fs))
    assert same(flat(state), expected)
    assert state["step"] == 1 and state["note"] == "seed 1"


def record_crcs(path: Path) -> set[int]:
    """The crc32 fields of every record of every item a checkpoint's metadata names."""
    with open(path / ".metadata", "rb") as f:
        metadata = pickle.load(f)
    found: set[int] = set()
    for info in metadata.storage_data.values():
        with open(path / info.relative_path, "rb") as f:
            f.seek(info.offset)
            item = f.read(info.length)
        if item[:2] == b"PK":  # a tensor's torch.save archive (plain values are pickles)
            found |= {record.CRC for record in zipfile.ZipFile(io.BytesIO(item)).infolist()}
    return found


def test_a_save_into_node_storage_skips_torchs_crc32_and_torchs_reader_loads_it(
    fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """Node storage checksums every chunk, so its files' records carry no crc32
    (torch.load never checks one); any other filesystem gets torch's crc32."""
    expected = saved(fs, tmp_path / "ckpt")
    crcs = record_crcs(tmp_path / "ckpt")
    node_storage = not isinstance(fs, pafs.LocalFileSystem)
    assert crcs == {0} if node_storage else 0 not in crcs
    state = trained(2)
    dcp.load(state, storage_reader=FileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert same(flat(state), expected)
    buffer = io.BytesIO()  # this thread's own saves keep theirs afterwards
    torch.save(torch.ones(4), buffer)
    assert 0 not in {r.CRC for r in zipfile.ZipFile(io.BytesIO(buffer.getvalue())).infolist()}


def test_async_save_keeps_the_state_as_it_was_when_staged(
    fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """``dcp.async_save`` returns once the state dict is copied: changing it while
    the save runs does not change what is saved."""
    state = trained(1)
    expected = flat(state)
    writer = NodeStorageWriter(str(tmp_path / "ckpt"), fs)
    future = dcp.async_save(state, storage_writer=writer, no_dist=True)
    for tensor in state["model"].values():
        tensor.add_(1.0)  # the next training step, while the save goes on
    future.result()
    restored = trained(2)
    dcp.load(restored, storage_reader=NodeStorageReader(str(tmp_path / "ckpt"), fs), no_dist=True)
    assert same(flat(restored), expected)


def test_a_checkpoint_without_its_metadata_file_is_not_restored(
    fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """A save that did not finish leaves shards without ``.metadata``: an error
    naming the missing file, and nothing loaded."""
    saved(fs, tmp_path / "ckpt")
    os.unlink(tmp_path / "ckpt" / ".metadata")
    state = trained(2)
    before = flat(state)
    with pytest.raises(FileNotFoundError, match="no DCP metadata file") as raised:
        load(state, Checkpoint(str(tmp_path / "ckpt"), filesystem=fs))
    assert raised.value.filename == f"{tmp_path}/ckpt/.metadata"
    assert same(flat(state), before)
    # Through dcp.load itself: DCP's CheckpointException carries the same message.
    reader = NodeStorageReader(str(tmp_path / "ckpt"), fs)
    message = f"no DCP metadata file.*{tmp_path}/ckpt/.metadata"
    with pytest.raises(CheckpointException, match=message):
        dcp.load(state, storage_reader=reader, no_dist=True)


def test_a_truncated_shard_is_an_error_and_nothing_is_half_loaded(
    fs: pafs.FileSystem, tmp_path: Path
) -> None:
    """The shard loses its last bytes: only the last tensor in it is unreadable.
    torch's own FileSystemReader copies every tensor before that one into the
    state dict and then fails; this reader reads everything first."""
    saved(fs, tmp_path / "ckpt")
    shard = tmp_path / "ckpt" / "__0_0.distcp"
    os.truncate(shard, shard.stat().st_size - 100)
    state = trained(2)
    before = flat(state)
    with pytest.raises(OSError, match="truncated DCP shard") as raised:
        load(state, Checkpoint(str(tmp_path / "ckpt"), filesystem=fs))
    assert raised.value.filename == str(shard)
    assert same(flat(state), before), "the state dict was changed by a failed load"

    with pytest.raises(CheckpointException):  # the contrast: torch's own reader
        dcp.load(state, storage_reader=FileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert not same(flat(state), before), "torch's reader no longer half-loads: update this"


def odd_tensors() -> dict[str, Any]:
    """Tensors a staged load must carry exactly: other dtypes, no elements, no
    dimensions, and a destination that is a strided view."""
    torch.manual_seed(3)
    return {
        "half": torch.randn(64, 33, dtype=torch.bfloat16),
        "flags": torch.rand(17) > 0.5,
        "empty": torch.zeros(0, 5),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
        "wide": torch.randn(40, 24),
        "ints": torch.arange(-50, 50, dtype=torch.int16),
    }


def test_a_load_writes_what_torchs_reader_writes_whatever_the_tensor(
    fs: pafs.FileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader stages each decoded tensor on disk before it writes the state
    dict; what lands there is what torch's own reader puts there (a float32
    destination for a bfloat16 value converts it, a transposed destination is
    written through), and the staging file is gone afterwards."""
    dcp.save(
        odd_tensors(), storage_writer=NodeStorageWriter(str(tmp_path / "ckpt"), fs), no_dist=True
    )

    def blank() -> dict[str, Any]:
        out = {k: torch.zeros_like(v) for k, v in odd_tensors().items()}
        out["half"] = torch.zeros(64, 33)  # float32: converted on copy
        out["wide"] = torch.zeros(24, 40).t()  # a strided view
        return out

    stage = tmp_path / "stage"
    stage.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(stage))
    ours, theirs = blank(), blank()
    dcp.load(ours, storage_reader=NodeStorageReader(str(tmp_path / "ckpt"), fs), no_dist=True)
    dcp.load(theirs, storage_reader=FileSystemReader(tmp_path / "ckpt"), no_dist=True)
    assert same(ours, theirs) and same(ours, {**odd_tensors(), "half": ours["half"]})
    assert torch.equal(ours["half"], odd_tensors()["half"].float())
    assert os.listdir(stage) == []


def test_a_load_that_cannot_stage_on_disk_says_where_and_loads_nothing(
    fs: pafs.FileSystem, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No room (here: no directory) for the staging file: an error naming the
    directory and TMPDIR, and the state dict as it was."""
    saved(fs, tmp_path / "ckpt")
    missing = str(tmp_path / "no-such-dir")
    monkeypatch.setattr(tempfile, "tempdir", missing)
    state = trained(2)
    before = flat(state)
    with pytest.raises(OSError, match="set TMPDIR") as raised:
        load(state, Checkpoint(str(tmp_path / "ckpt"), filesystem=fs))
    assert raised.value.filename == missing
    assert same(flat(state), before)


def test_a_load_whose_staging_runs_out_of_room_loads_nothing(tmp_path: Path) -> None:
    """The disk fills while the decoded tensors are staged (here: a file-size limit
    of 64 KiB on this process, past which a write fails with EFBIG): an error
    naming the staging directory, and the state dict as it was."""
    fs = pafs.LocalFileSystem()
    saved(fs, tmp_path / "ckpt")
    state = trained(2)
    before = flat(state)
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    ignored = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, limits[1]))
    try:
        with pytest.raises(OSError, match="could not take") as raised:
            load(state, Checkpoint(str(tmp_path / "ckpt"), filesystem=fs))
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, ignored)
    assert raised.value.errno == errno.EFBIG and raised.value.filename == tempfile.gettempdir()
    assert same(flat(state), before)


class FailingPlanner(DefaultSavePlanner):
    """Fails while the second tensor is being written."""

    def __init__(self) -> None:
        super().__init__()
        self.resolved = 0

    def resolve_data(self, write_item: Any) -> Any:
        self.resolved += 1
        if self.resolved == 3:
            raise RuntimeError("injected failure while writing")
        return super().resolve_data(write_item)


def test_a_save_that_fails_while_writing_leaves_no_file(
    fs: pafs.FileSystem, tmp_path: Path
) -> None:
    writer = NodeStorageWriter(str(tmp_path / "ckpt"), fs)
    with pytest.raises(CheckpointException, match="injected failure while writing"):
        dcp.save(trained(1), storage_writer=writer, planner=FailingPlanner(), no_dist=True)
    assert os.listdir(tmp_path / "ckpt") == []


def test_a_path_outside_the_storage_root_is_refused(tmp_path: Path) -> None:
    """Refused before anything reaches the storage node (no Ray needed)."""
    fs = air_transfer.storage_filesystem(root=str(tmp_path / "root"))
    outside = str(tmp_path / "elsewhere")
    with pytest.raises(PermissionError):
        load(trained(1), Checkpoint(outside, filesystem=fs))
    writer = NodeStorageWriter(outside, fs)
    with pytest.raises(CheckpointException, match="PermissionError"):
        dcp.save(trained(1), storage_writer=writer, no_dist=True)
    assert not os.path.exists(outside)


def test_without_a_filesystem_a_one_node_cluster_is_its_node_storage(
    ray_local: None, tmp_path: Path
) -> None:
    """With one node there is no guess: a writer and a reader without a filesystem
    use node storage of it; and the node's IP address names it."""
    import ray

    here = ray.get_runtime_context().get_node_id()
    writer = NodeStorageWriter(str(tmp_path / "ckpt"))
    assert writer.fs.filesystem.handler.node_id == here  # type: ignore[attr-defined]
    state = trained(1)
    dcp.save(state, storage_writer=writer, no_dist=True)
    restored = trained(2)
    dcp.load(restored, storage_reader=NodeStorageReader(str(tmp_path / "ckpt")), no_dist=True)
    assert same(flat(restored), flat(state))
    by_ip = air_transfer.storage_filesystem(node=ray.util.get_node_ip_address(), root=str(tmp_path))
    assert by_ip.handler.node_id == here
