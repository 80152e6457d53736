"""What each bad input gets through the public API: a typed error naming the path,
chunk, size or owner, and nothing written at the target."""

from __future__ import annotations

import dataclasses
import errno
import os
import shutil
import threading
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray

from air_transfer import (
    CheckpointLostError,
    ChecksumError,
    ChunkedCheckpoint,
    ManifestError,
    SourceChangedError,
    TransferConfig,
)
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.config import KiB
from air_transfer.core.scan import Source, scan
from air_transfer.extend import Manifest, PackRequest, get_strategy, register_strategy, strategies
from air_transfer.transfer.relay import Relays
from air_transfer.transfer.strategies.base import Layout, Packed
from air_transfer.transfer.strategies.chunked import ChunkedStrategy
from tests.support.trees import assert_same_tree, rich_tree
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("ray_local")

STRATEGIES = sorted(strategies)


def config_for(strategy: str) -> TransferConfig:
    return TransferConfig(chunk_bytes=4 * KiB, window=512, strategy=strategy)


def test_symlink_outside_unless_followed(tmp_path: Path) -> None:
    (tmp_path / "secret").write_bytes(b"s3cret")
    src = tmp_path / "src"
    src.mkdir()
    os.symlink(tmp_path / "secret", src / "leak")
    ckpt = ChunkedCheckpoint.from_directory(src)
    with pytest.raises(
        ManifestError, match=r"leak.*points outside the checkpoint.*follow_symlinks"
    ):
        ckpt.to_object_ref()
    restored = ChunkedCheckpoint.from_object_ref(
        ckpt.to_object_ref(config=TransferConfig(follow_symlinks=True))
    )
    out = Path(restored.to_directory(tmp_path / "out"))
    assert not (out / "leak").is_symlink() and (out / "leak").read_bytes() == b"s3cret"


def altered(restored: ChunkedCheckpoint, chunk: int) -> ChunkedCheckpoint:
    """The same payload under a manifest that expects other bytes for ``chunk``."""
    handle = restored.handle().complete()
    m = handle.manifest
    sums = list(m.chunks)
    sums[chunk] = "0" * 32
    bad = Manifest(m.entries, m.chunk_bytes, tuple(sums))
    return ChunkedCheckpoint._from_handle(dataclasses.replace(handle, manifest=bad))


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_chunk_not_matching_its_checksum(tmp_path: Path, strategy: str) -> None:
    src = rich_tree(tmp_path / "src")
    restored = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config=config_for(strategy))
    )
    corrupt = altered(restored, chunk=3)
    # `streamed` reads the source at transfer time: there, bytes that differ from
    # the packing-time checksum mean the directory changed, and the agent says so.
    error, message = (
        (SourceChangedError, r"changed since it was packed: chunk 3 \(files 'model.bin'\)")
        if strategy == "streamed"
        else (ChecksumError, r"chunk 3 of \d+ .*carries 'model.bin'")
    )
    with pytest.raises(error, match=message):
        corrupt.to_directory(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]
    with pytest.raises(error, match="chunk 3"), corrupt.open("model.bin") as f:
        f.read()
    # verify=False trusts the payload (and the writer still checks lengths)
    unchecked = ChunkedCheckpoint._from_handle(
        dataclasses.replace(corrupt._handle, config=config_for(strategy).replace(verify=False))
    )
    unchecked.to_directory(tmp_path / "unchecked")
    assert (tmp_path / "unchecked" / "model.bin").read_bytes() == (src / "model.bin").read_bytes()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("change", ["shrink", "grow"])
def test_file_changing_size_while_packed(tmp_path: Path, strategy: str, change: str) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.bin").write_bytes(os.urandom(10 * KiB))
    source = Source(pafs.LocalFileSystem(), str(src))
    scanned = scan(source)
    # The training loop rewrites the file between the scan and the read of its bytes.
    (src / "w.bin").write_bytes(os.urandom(5 * KiB if change == "shrink" else 15 * KiB))
    word = "shrank" if change == "shrink" else "grew"
    with pytest.raises(SourceChangedError, match=rf"w.bin' {word} while being packed"):
        get_strategy(strategy)().pack(
            PackRequest(source, scanned.files, scanned.stamps, config_for(strategy))
        )


def test_inline_refuses_a_checkpoint_over_its_limit(tmp_path: Path) -> None:
    (tmp_path / "w").write_bytes(os.urandom(9 * KiB))
    config = TransferConfig(chunk_bytes=4 * KiB, window=2, strategy="inline")
    with pytest.raises(ValueError, match=r"9216 bytes of files, over inline_max_bytes=8192"):
        ChunkedCheckpoint.from_directory(tmp_path).to_object_ref(config=config)


def test_from_object_ref_refuses_other_objects() -> None:
    with pytest.raises(TypeError, match="holds a dict, not a checkpoint"):
        ChunkedCheckpoint.from_object_ref(ray.put({"a": 1}))
    with pytest.raises(TypeError, match=r"expects a ray\.ObjectRef"):
        ChunkedCheckpoint.from_object_ref("not a ref")  # type: ignore[arg-type]


def test_local_checkpoint_has_no_manifest_until_packed(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"abc")
    ckpt = ChunkedCheckpoint.from_directory(tmp_path)
    with pytest.raises(ValueError, match="no manifest until packed"):
        _ = ckpt.manifest
    assert ckpt.pack().manifest.total_bytes == 3


@ray.remote(num_cpus=0)
class Producer:
    """A process that packs a checkpoint and then can be killed."""

    def __init__(self) -> None:
        # A custom strategy must be registered in the process that packs, as a user
        # would do at import of their own module.
        from air_transfer.extend import register_strategy
        from tests.support import strategies_for_tests

        register_strategy(strategies_for_tests.BytesChunksStrategy)

    def share(self, path: str, config: TransferConfig) -> tuple[list, ChunkedCheckpoint]:
        ref = ChunkedCheckpoint.from_directory(path).to_object_ref(config=config)
        self.keep = ref
        return [ref], ChunkedCheckpoint.from_object_ref(ref)


@pytest.mark.parametrize("strategy", [s for s in STRATEGIES if s != "streamed"])
def test_owner_died(tmp_path: Path, strategy: str) -> None:
    src = rich_tree(tmp_path / "src")
    (src / "weights.bin").write_bytes(os.urandom(1024 * KiB))
    # Chunks over Ray's inline limit (100 KiB): a smaller task result is returned
    # inline to its owner, and a copy a reader's node got may outlive the owner there.
    config = config_for(strategy).replace(chunk_bytes=256 * KiB, window=8)
    producer = Producer.options(name=f"producer-{strategy}").remote()
    (ref,), restored = ray.get(producer.share.remote(str(src), config))
    ray.kill(producer)
    # Ray frees a dead owner's objects asynchronously (a second or two); until then
    # a local copy may still be read, which is fine. What must happen is that reading
    # then fails with CheckpointLostError, promptly, writing nothing.
    error = read_until_lost(restored, tmp_path / "out")
    assert f"owner, actor producer-{strategy}" in str(error)
    assert "keep the process that called to_object_ref() alive" in str(error)
    assert error.__cause__ is not None
    assert not (tmp_path / "out").exists()
    assert not [p for p in os.listdir(tmp_path) if "staging" in p]
    with pytest.raises(CheckpointLostError, match="checkpoint handle"):
        ChunkedCheckpoint.from_object_ref(ref)


def read_until_lost(ckpt: ChunkedCheckpoint, target: Path, limit_s: float = 60) -> Exception:
    """The CheckpointLostError that reading ``ckpt`` raises once its owner's objects are
    gone (each read that still succeeds is discarded)."""

    def lost() -> Exception | None:
        try:
            ckpt.to_directory(target)
        except CheckpointLostError as e:
            return e
        shutil.rmtree(target)
        return None

    return eventually(lost, "the chunks of a dead owner to become unreadable", limit_s)


def test_streamed_survives_its_producer(tmp_path: Path) -> None:
    """``streamed`` chunks are made on demand by the node agent, which outlives the
    process that packed."""
    src = rich_tree(tmp_path / "src")
    producer = Producer.remote()
    _, restored = ray.get(producer.share.remote(str(src), config_for("streamed")))
    ray.kill(producer)
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(producer.share.remote(str(src), config_for("streamed")))
    restored.to_directory(tmp_path / "out")
    assert_same_tree(src, tmp_path / "out")


# -- to_object_ref_async: checks on the caller's thread, submission on a background one --
def _fifo(src: Path) -> None:
    os.mkfifo(src / "pipe")


def _outside(src: Path) -> None:
    (src.parent / "secret").write_bytes(b"s")
    os.symlink(src.parent / "secret", src / "leak")


BAD_AT_THE_CALL = {
    "missing": (lambda src: shutil.rmtree(src), TransferConfig(), FileNotFoundError, "src"),
    "fifo": (_fifo, TransferConfig(), ManifestError, r"pipe.*socket, FIFO or device"),
    "outside": (_outside, TransferConfig(), ManifestError, r"leak.*points outside"),
    "over inline": (
        lambda src: None,
        TransferConfig(chunk_bytes=4 * KiB, window=2, strategy="inline"),
        ValueError,
        r"9216 bytes of files, over inline_max_bytes=8192",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_AT_THE_CALL))
def test_bad_input_raises_at_the_async_call(tmp_path: Path, case: str) -> None:
    """The scan and every check of the input stay on the caller's thread: the call
    itself raises, before any packing is submitted, and leaves no relay waiting."""
    make_bad, config, error, match = BAD_AT_THE_CALL[case]
    src = tmp_path / "src"
    src.mkdir()
    (src / "w").write_bytes(os.urandom(9 * KiB))
    make_bad(src)
    with pytest.raises(error, match=match):
        ChunkedCheckpoint.from_directory(src).to_object_ref_async(config=config)
    assert ray.get(AgentClient().call(Relays.waiting)) == 0


class FailingSubmit(ChunkedStrategy):
    """Its packing fails on the submitting thread, as a lost agent or a full disk
    would make it (its own layout: ``pack`` runs there)."""

    name = "test-failing-submit"
    layout = Layout.CUSTOM

    def pack(self, request: PackRequest) -> Packed:
        raise OSError(errno.EIO, f"cannot submit the packing of {request.source.root}")


class UnpicklableFailure(ChunkedStrategy):
    """Packing on the submitting thread fails with an error that cannot travel to
    the agent."""

    name = "test-unpicklable-failure"
    layout = Layout.CUSTOM

    def pack(self, request: PackRequest) -> Packed:
        error = OSError(errno.EIO, "cannot submit, holding a lock")
        error.lock = threading.Lock()  # type: ignore[attr-defined]
        raise error


@pytest.mark.usefixtures("registry_restored")
def test_a_failing_background_submission_fails_the_future_and_the_ref(tmp_path: Path) -> None:
    """What the background thread raises reaches both ends as itself: the future
    and every reader of its ref (which exists, and resolves, though nothing was
    packed); the relay that held the ref is gone afterwards."""
    register_strategy(FailingSubmit)
    (tmp_path / "w").write_bytes(os.urandom(9 * KiB))
    future = ChunkedCheckpoint.from_directory(tmp_path).to_object_ref_async(
        config=TransferConfig(strategy=FailingSubmit.name)
    )
    with pytest.raises(OSError, match="cannot submit the packing of") as raised:
        future.result(timeout=60)
    assert raised.value.errno == errno.EIO
    assert isinstance(future.exception(0), OSError)
    with pytest.raises(OSError, match="cannot submit the packing of"):
        ChunkedCheckpoint.from_object_ref(future.ref)
    eventually(
        lambda: ray.get(AgentClient().call(Relays.waiting)) == 0,
        "the relay let go",
        timeout_s=60,
    )


@pytest.mark.usefixtures("registry_restored")
def test_a_failure_that_cannot_travel_still_reaches_the_readers(tmp_path: Path) -> None:
    """The future raises the error itself; readers of the ref, in other processes,
    get its text (it cannot be pickled), never a wait that does not end."""
    register_strategy(UnpicklableFailure)
    (tmp_path / "w").write_bytes(b"w")
    future = ChunkedCheckpoint.from_directory(tmp_path).to_object_ref_async(
        config=TransferConfig(strategy=UnpicklableFailure.name)
    )
    with pytest.raises(OSError, match="holding a lock"):
        future.result(timeout=60)
    with pytest.raises(RuntimeError, match=r"submitting the packing failed: .*holding a lock"):
        ChunkedCheckpoint.from_object_ref(future.ref)
