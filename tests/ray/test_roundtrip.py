"""The round-trip contract every registered strategy must pass (the fsspec
``tests/abstract`` idea): whatever goes in through ``to_object_ref`` comes out of
``from_object_ref(...).to_directory`` identical, in this process and in another."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import pytest
import ray
from ray.train import Checkpoint

from air_transfer import ChunkedCheckpoint, TransferConfig
from air_transfer.config import KiB
from air_transfer.extend import strategies
from tests.support.direct import direct_writers, skip_unless_o_direct
from tests.support.trees import assert_same_tree, rich_tree, tree_listing

pytestmark = pytest.mark.usefixtures("ray_local")

STRATEGIES = sorted(strategies)


def config_for(strategy: str, chunk_bytes: int = 4 * KiB) -> TransferConfig:
    # A window wide enough that every test checkpoint fits `inline` too.
    return TransferConfig(chunk_bytes=chunk_bytes, window=512, strategy=strategy)


def round_trip(src: Path, out: Path, config: TransferConfig) -> ChunkedCheckpoint:
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=config)
    restored = ChunkedCheckpoint.from_object_ref(ref)
    assert restored.to_directory(out) == str(out)
    return restored


@pytest.fixture(params=STRATEGIES)
def strategy(request: pytest.FixtureRequest) -> str:
    return request.param


def test_rich_tree(tmp_path: Path, strategy: str) -> None:
    src = rich_tree(tmp_path / "src")
    restored = round_trip(src, tmp_path / "out", config_for(strategy))
    assert_same_tree(src, tmp_path / "out")
    assert restored.manifest.num_chunks > 5
    assert restored.get_metadata() == {"epoch": 3, "note": "café"}


def test_zero_byte_checkpoints(tmp_path: Path, strategy: str) -> None:
    (tmp_path / "empty").mkdir()
    round_trip(tmp_path / "empty", tmp_path / "out1", config_for(strategy))
    assert os.listdir(tmp_path / "out1") == []
    only_empty = tmp_path / "only_empty"
    (only_empty / "d").mkdir(parents=True)
    (only_empty / "d" / "a").write_bytes(b"")
    (only_empty / "b").write_bytes(b"")
    restored = round_trip(only_empty, tmp_path / "out2", config_for(strategy))
    assert restored.manifest.num_chunks == 0
    assert_same_tree(only_empty, tmp_path / "out2")


def test_five_thousand_tiny_files(tmp_path: Path, strategy: str) -> None:
    rng = random.Random(5)
    src = tmp_path / "src"
    for i in range(5000):
        d = src / f"shard_{i % 17:02d}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"t{i}.bin").write_bytes(rng.randbytes(rng.randrange(0, 200)))
    restored = round_trip(src, tmp_path / "out", config_for(strategy, chunk_bytes=64 * KiB))
    assert restored.manifest.num_chunks > 1  # small files share chunks
    assert_same_tree(src, tmp_path / "out")


def test_one_file_spanning_many_chunks(tmp_path: Path, strategy: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(300 * KiB + 17))
    restored = round_trip(src, tmp_path / "out", config_for(strategy))
    assert restored.manifest.num_chunks == 76
    assert_same_tree(src, tmp_path / "out")


@pytest.mark.parametrize("sizes", [[4096], [4096, 4096], [1000, 3096, 8192], [4095, 1, 0, 4096]])
def test_sizes_exactly_on_chunk_boundaries(tmp_path: Path, strategy: str, sizes: list) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i, size in enumerate(sizes):
        (src / f"f{i}").write_bytes(os.urandom(size))
    restored = round_trip(src, tmp_path / "out", config_for(strategy))
    assert restored.manifest.num_chunks == sum(sizes) // 4096
    assert_same_tree(src, tmp_path / "out")


def test_non_ascii_names(tmp_path: Path, strategy: str) -> None:
    src = tmp_path / "src"
    for name in ["模型/权重.bin", "Ñandú/ß.txt", "emoji 🚀/ok", "ελληνικά", "a b c/d e"]:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode() * 100)
    round_trip(src, tmp_path / "out", config_for(strategy))
    assert_same_tree(src, tmp_path / "out")


def test_open_streams_one_file_with_seeks(tmp_path: Path, strategy: str) -> None:
    src = rich_tree(tmp_path / "src")
    data = (src / "model.bin").read_bytes()
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config=config_for(strategy))
    )
    with restored.open("model.bin") as f:
        assert f.read(10) == data[:10]
        f.seek(30_000)
        assert f.read(5000) == data[30_000:35_000]
        f.seek(100)  # backwards: a new chunk stream from the right chunk
        assert f.read() == data[100:]
        assert f.read(1) == b""
    with restored.open("sub/deeper/leaf.npy") as f:
        assert f.read() == (src / "sub" / "deeper" / "leaf.npy").read_bytes()
    with restored.open("empty.bin") as f:
        assert f.read() == b""
    with pytest.raises(FileNotFoundError, match="nope"):
        restored.open("nope")
    with pytest.raises(IsADirectoryError):
        restored.open("sub")


def test_consumer_in_another_process(tmp_path: Path, strategy: str) -> None:
    src = rich_tree(tmp_path / "src")
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=config_for(strategy))

    @ray.remote
    def consume(refs: list, target: str) -> tuple[int, str]:
        ckpt = ChunkedCheckpoint.from_object_ref(refs[0])
        ckpt.to_directory(target)
        return os.getpid(), repr(ckpt)

    pid, description = ray.get(consume.remote([ref], str(tmp_path / "out")))
    assert pid != os.getpid()
    assert f"strategy='{strategy}'" in description
    assert_same_tree(src, tmp_path / "out")


def test_restored_checkpoint_travels_small(tmp_path: Path, strategy: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(2 * 1024 * KiB))
    config = TransferConfig(chunk_bytes=256 * KiB, window=8, strategy=strategy)
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config=config)
    )
    assert isinstance(restored, Checkpoint)
    assert len(ray.cloudpickle.dumps(restored)) < 16 * KiB  # manifest + refs, no bytes

    @ray.remote
    def consume(ckpt: ChunkedCheckpoint, target: str) -> str:
        return ckpt.to_directory(target)

    ray.get(consume.remote(restored, str(tmp_path / "as_arg")))
    ray.get(consume.remote(ray.put(restored), str(tmp_path / "as_put")))
    assert_same_tree(src, tmp_path / "as_arg")
    assert_same_tree(src, tmp_path / "as_put")
    # Re-sharing a transferred checkpoint re-uses its chunks instead of repacking.
    again = ChunkedCheckpoint.from_object_ref(restored.to_object_ref())
    assert again.manifest == restored.manifest
    assert again._handle.payload == restored._handle.payload


def test_as_directory_cleans_up(tmp_path: Path, strategy: str) -> None:
    src = rich_tree(tmp_path / "src")
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config=config_for(strategy))
    )
    with restored.as_directory() as d:
        assert_same_tree(src, Path(d))
    assert not os.path.exists(d)
    tmp = restored.to_directory()  # Ray's default: a fresh temporary directory
    try:
        assert_same_tree(src, Path(tmp))
    finally:
        shutil.rmtree(tmp)


def test_restored_view_is_a_read_only_pyarrow_filesystem(tmp_path: Path, strategy: str) -> None:
    import pyarrow.fs as pafs

    src = rich_tree(tmp_path / "src")
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config=config_for(strategy))
    )
    fs = restored.filesystem
    info = fs.get_file_info("/sub/deeper/leaf.npy")
    assert info.type == pafs.FileType.File and info.size == 4096
    assert fs.get_file_info("/nope").type == pafs.FileType.NotFound
    listed = {i.path for i in fs.get_file_info(pafs.FileSelector("/sub", recursive=False))}
    assert listed == {
        "/sub/deeper",
        "/sub/zero",
        "/sub/empty_nested",
        "/sub/model_link",
        "/sub/dir_link",
    }
    with pytest.raises(FileNotFoundError):
        fs.get_file_info(pafs.FileSelector("/nope"))
    with pytest.raises(NotADirectoryError):
        fs.get_file_info(pafs.FileSelector("/model.bin"))
    with fs.open_input_file("/sub/model_link") as f:  # links read as their target
        assert f.read() == (src / "model.bin").read_bytes()
    with pytest.raises(PermissionError, match="read-only"):
        restored.set_metadata({"x": 1})
    with pytest.raises(PermissionError, match="read-only"):
        fs.delete_dir("/sub")
    # Any pyarrow tool can read it: copy it out with pyarrow's own copier.
    pafs.copy_files("/", str(tmp_path / "copied"), source_filesystem=fs)
    assert (tmp_path / "copied" / "model.bin").read_bytes() == (src / "model.bin").read_bytes()


def test_metadata_set_before_packing_survives(tmp_path: Path, strategy: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w").write_bytes(b"w")
    ckpt = ChunkedCheckpoint.from_directory(src)
    ckpt.set_metadata({"step": 42})
    restored = ChunkedCheckpoint.from_object_ref(ckpt.to_object_ref(config=config_for(strategy)))
    assert restored.get_metadata() == {"step": 42}


def test_pack_from_any_pyarrow_filesystem(tmp_path: Path, strategy: str) -> None:
    import pyarrow.fs as pafs

    fs = pafs._MockFileSystem()
    fs.create_dir("bucket/run/ckpt/sub")
    payload = {"bucket/run/ckpt/sub/w.bin": os.urandom(10_000), "bucket/run/ckpt/x.json": b"{}"}
    for path, data in payload.items():
        with fs.open_output_stream(path) as f:
            f.write(data)
    remote = Checkpoint("bucket/run/ckpt", filesystem=fs)
    if strategy == "streamed":
        # An in-memory filesystem exists only in this process: no agent can stream it.
        with pytest.raises(ValueError, match="cannot be sent to another process"):
            ChunkedCheckpoint.from_checkpoint(remote).to_object_ref(config=config_for(strategy))
        return
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_checkpoint(remote).to_object_ref(config=config_for(strategy))
    )
    out = Path(restored.to_directory(tmp_path / "out"))
    assert (out / "sub" / "w.bin").read_bytes() == payload["bucket/run/ckpt/sub/w.bin"]
    assert (out / "x.json").read_bytes() == b"{}"


def test_existing_target_is_merged(tmp_path: Path, strategy: str) -> None:
    src = rich_tree(tmp_path / "src")
    target = tmp_path / "out"
    target.mkdir()
    (target / "other.txt").write_bytes(b"keep me")
    (target / "model.bin").write_bytes(b"stale")
    round_trip(src, target, config_for(strategy))
    listing = tree_listing(target)
    assert listing.pop("other.txt")[2] == b"keep me"
    assert listing == tree_listing(src)


@pytest.mark.parametrize("strategy_name", ["chunked", "streamed"])
def test_large_files_written_around_the_page_cache(tmp_path: Path, strategy_name: str) -> None:
    """The consumer writes 16 MiB+ files with O_DIRECT (the default) through
    page-aligned bounce buffers, odd tails included. (It passed before when the
    writes silently fell back to the page cache.)"""
    skip_unless_o_direct(tmp_path)
    src = tmp_path / "src"
    (src / "shards").mkdir(parents=True)
    rng = random.Random(5)
    (src / "model.bin").write_bytes(rng.randbytes(20 * 1024**2 + 4097))
    (src / "shards" / "0.bin").write_bytes(rng.randbytes(16 * 1024**2 + 1))
    (src / "config.json").write_bytes(b"{}")
    config = TransferConfig(chunk_bytes=3 * 1024**2 + 7, strategy=strategy_name)
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=config)

    @ray.remote
    def consume(refs: list, target: str) -> list[tuple[str, bool]]:
        """Restores in a worker; the files it wrote direct, with whether they stayed so."""
        from air_transfer.core import file_sink

        with direct_writers(file_sink) as writers:
            ChunkedCheckpoint.from_object_ref(refs[0]).to_directory(target)
        return [(os.path.basename(w.path), w.direct) for w in writers]

    went_direct = ray.get(consume.remote([ref], str(tmp_path / "out")))
    assert_same_tree(src, tmp_path / "out")
    assert sorted(went_direct) == [("0.bin", True), ("model.bin", True)]
