"""The blocking call stores every other chunk itself while the node agent stores the
rest (``transfer.shared_pack``): the caller's chunks go into the store
from their mapping under a read lease, their checksums taken of the stored bytes;
a change of the source in the caller's part raises SourceChangedError and leaves
nothing in the store; a truncate while the caller maps a chunk, however long the
caller stalls, never crashes it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import ray
import ray.cloudpickle

from air_transfer import ChunkedCheckpoint, SourceChangedError, TransferConfig
from air_transfer.cluster._ray_core import object_store_free_bytes
from air_transfer.cluster.nodes import node_agent, this_node_id
from air_transfer.config import MiB
from air_transfer.core import packer, proven_read
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.plan import Span
from tests.support import rewriters
from tests.support.leases import lease_listed, truncated_while_stalled
from tests.support.live_chunks import counters
from tests.support.rewriters import CHANGED, RewriteOnce, install_in_agent
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("ray_local")
# The hooks run in the node agent too: ship their code by value.
ray.cloudpickle.register_pickle_by_value(rewriters)

CHUNK = 2 * MiB
CONFIG = TransferConfig(chunk_bytes=CHUNK, window=4, strategy="chunked")


def make_source(tmp_path: Path, nbytes: int) -> tuple[Path, bytes]:
    src = tmp_path / "src"
    src.mkdir()
    data = os.urandom(nbytes)
    (src / "w.bin").write_bytes(data)
    return src, data


def store_free() -> int:
    free = object_store_free_bytes(this_node_id())
    assert free is not None
    return free


def test_the_caller_stores_every_other_chunk_mapped_and_the_agent_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, data = make_source(tmp_path, 6 * CHUNK)
    here: list[tuple[int, bool]] = []

    def record(where: str, span: Span) -> None:
        here.append((span.file_offset // CHUNK, lease_listed(where)))

    monkeypatch.setattr(packer, "_while_mapped", record)
    before = counters()["bytes_packed"]
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=CONFIG)
    assert here == [(0, True), (2, True), (4, True)]  # mapped here, under a lease
    assert counters()["bytes_packed"] - before == 3 * CHUNK  # chunks 1, 3 and 5
    # Every checksum, the ones the agent took of the caller's stored chunks too, is
    # that of the source's bytes.
    chunks = ChunkedCheckpoint.from_object_ref(ref).handle().complete().manifest.chunks
    expected = [chunk_checksum(data[i : i + CHUNK]) for i in range(0, len(data), CHUNK)]
    assert list(chunks or []) == expected
    out = tmp_path / "out"
    ChunkedCheckpoint.from_object_ref(ref).to_directory(str(out))
    assert (out / "w.bin").read_bytes() == data


@pytest.mark.parametrize("where", ["caller", "agent"])
def test_a_change_in_either_part_raises_and_leaves_nothing_in_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """Chunk 2 (the caller's) or chunk 3 (the agent's) is rewritten between the
    check before its mapping and the mapping: the call raises, returns no ref, and
    every chunk either part stored is freed."""
    src, _ = make_source(tmp_path, 8 * CHUNK)
    baseline = eventually(store_free, "the store's free bytes")
    agent = node_agent()
    if where == "caller":
        hook = RewriteOnce("w.bin", offset=2 * CHUNK)
        monkeypatch.setattr(proven_read, "_after_span_read", hook)
    else:
        install_in_agent(agent, RewriteOnce("w.bin", offset=3 * CHUNK))
    try:
        with pytest.raises(SourceChangedError, match=CHANGED) as e:
            ChunkedCheckpoint.from_directory(src).to_object_ref(config=CONFIG)
    finally:
        install_in_agent(agent, None)
    assert e.value.filename == str(src / "w.bin")
    del e
    eventually(
        lambda: store_free() >= baseline - CHUNK,
        lambda: f"the chunks to leave the store ({baseline - store_free()} bytes held)",
    )


def test_a_caller_stalled_with_a_chunk_mapped_survives_a_truncate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One chunk, packed by the caller, which stalls with it mapped until another
    process's truncate went through: its lease handed back on the break, the
    mapping a private copy, the chunk stored whole from the version scanned."""
    src, data = make_source(tmp_path, CHUNK)
    fired: list[bool] = []

    def stall_while_mapped(where: str, span: Span) -> None:
        if not fired:
            fired.append(True)
            truncated_while_stalled(where)

    monkeypatch.setattr(packer, "_while_mapped", stall_while_mapped)
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=CONFIG)
    assert fired and os.path.getsize(src / "w.bin") == 0
    out = tmp_path / "out"
    ChunkedCheckpoint.from_object_ref(ref).to_directory(str(out))
    assert (out / "w.bin").read_bytes() == data


def test_once_the_call_returns_the_checkpoint_no_longer_needs_the_agent(tmp_path: Path) -> None:
    """The call returns once every chunk is stored and every checksum taken, so an
    agent killed right after it leaves a checkpoint that restores whole (checksums
    still to come would be lost with it: every reader's CheckpointLostError)."""
    src, data = make_source(tmp_path, 32 * CHUNK)
    ref = ChunkedCheckpoint.from_directory(str(src)).to_object_ref(config=CONFIG)
    ray.kill(node_agent(this_node_id()))
    out = ChunkedCheckpoint.from_object_ref(ref).to_directory(str(tmp_path / "out"))
    assert (Path(out) / "w.bin").read_bytes() == data
