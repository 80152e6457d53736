"""The durable tier's codec (no Ray, a local tier): weights drained with
``bytegroup-zstd`` are stored shorter, named in their record, and read back
bit-identical (whole and by byte range) and checked; a file that does not shrink is
stored as it is (a plain file); a damaged stored chunk fails its read; a scrub that
reads the bytes back decodes them."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import pytest

from air_transfer.errors import ChecksumError
from air_transfer.storage.durable.reads import TierReads, open_verified
from air_transfer.storage.durable.settings import DrainSettings
from tests.support.drains import assert_same, drained, draining, local_target
from tests.support.trees import write_file
from tests.support.waiting import eventually

CHUNK = 64 * 1024
CODEC = DrainSettings(
    chunk_bytes=CHUNK, codec="bytegroup-zstd", rescan_s=60.0, backoff_s=(0.05, 0.5),
    scrub_s=None, scrub_bytes_per_s=1 << 30,
)  # fmt: skip


def _weights(n: int, seed: int) -> bytes:
    """``n`` fp16 weights as training leaves them: small, normally spread."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) * 0.02).astype(np.float16).tobytes()


def test_weights_are_stored_shorter_and_read_back_bit_identical(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    weights = _weights(200_000, 1)  # 400 KB: 7 chunks, the last one short
    noise = random.Random(2).randbytes(150_000)
    write_file(root / "ckpt" / "model.bin", weights)
    write_file(root / "ckpt" / "noise.bin", noise)
    with draining(root, target, CODEC) as drainer:
        drained(drainer)
        ticket = drainer.request(confirm=True)  # reads every stored byte back
        eventually(lambda: drainer.status().confirmed >= ticket, "a scrub that read back", 60)
        assert drainer.work.progress.lost == 0
    reads = TierReads(target)
    model, plain = reads.record("ckpt/model.bin"), reads.record("ckpt/noise.bin")
    assert model is not None and plain is not None
    assert model.codec == "bytegroup-zstd" and model.stored_size < 0.9 * len(weights)
    stored = tmp_path / "durable" / "ckpt" / "model.bin"
    assert stored.stat().st_size == model.stored_size
    assert plain.codec == "identity" and plain.stored is None
    assert (tmp_path / "durable" / "ckpt" / "noise.bin").read_bytes() == noise  # plain file
    assert open_verified(target, "ckpt/model.bin", model).read() == weights
    reader = open_verified(target, "ckpt/model.bin", model)
    reader.seek(3 * CHUNK - 5)
    assert reader.read(10) == weights[3 * CHUNK - 5 : 3 * CHUNK + 5]  # across chunks
    assert reads.listing("ckpt", False, set()) == [
        ("model.bin", pafs.FileType.File, len(weights), model.mtime_ns),
        ("noise.bin", pafs.FileType.File, len(noise), plain.mtime_ns),
    ]


def test_a_damaged_stored_chunk_fails_its_read(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    weights = _weights(100_000, 3)
    write_file(root / "model.bin", weights)
    with draining(root, target, CODEC) as drainer:
        drained(drainer)
    record = TierReads(target).record("model.bin")
    assert record is not None and record.stored is not None
    offset, length = record.stored_range(1)
    stored = tmp_path / "durable" / "model.bin"
    with open(stored, "r+b") as f:  # one bit of chunk 1's encoded bytes flipped
        f.seek(offset + length // 2)
        byte = f.read(1)
        f.seek(offset + length // 2)
        f.write(bytes([byte[0] ^ 4]))
    reader = open_verified(target, "model.bin", record)
    assert reader.read(CHUNK) == weights[:CHUNK]
    with pytest.raises(ChecksumError, match="chunk 1"):
        reader.read(10)


def test_an_unknown_codec_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match="bytegroup-zstd"):
        DrainSettings(codec="lz5")


def test_the_tier_as_plain_files_without_a_codec(tmp_path: Path) -> None:
    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    write_file(root / "model.bin", _weights(50_000, 4))
    with draining(root, target) as drainer:
        drained(drainer)
    assert_same(root, target)  # the object is the file


def test_cp_out_of_the_tier_decodes_by_its_manifests(tmp_path: Path) -> None:
    """``air-transfer cp`` from a path inside a durable tier (found by its root
    manifest above it) reads by the manifests: decoded, checked, only named files."""
    from air_transfer.cli.main import main

    root, target = tmp_path / "root", local_target(tmp_path / "durable")
    files = {"model.bin": _weights(120_000, 5), "opt/state.bin": _weights(60_000, 6)}
    for rel, data in files.items():
        write_file(root / "run" / "ckpt" / rel, data)
    with draining(root, target, CODEC) as drainer:
        drained(drainer)
    write_file(tmp_path / "durable" / "run" / "ckpt" / "stray.bin", b"not named")
    out = tmp_path / "out"
    assert main(["cp", f"file://{tmp_path}/durable/run/ckpt", str(out)]) == 0
    got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert got == files
