"""Torn pack: a file rewritten while it is packed must raise
SourceChangedError naming it, never reach a consumer as bytes of neither version.

The rewrites happen between a span's read and the fstat after it, through the
test-only ``proven_read._after_span_read`` hook (``rewriters``), in the driver or in the
node agent, so every interleaving here is deterministic; one test also runs a real
concurrent writer and checks the one property that must hold whatever the timing.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import ray.cloudpickle

from air_transfer import ChunkedCheckpoint, SourceChangedError, TransferConfig
from air_transfer.cluster.nodes import node_agent
from air_transfer.config import KiB
from air_transfer.core.plan import ChunkPlan, plan_chunks
from air_transfer.core.proven_read import fill_chunk
from air_transfer.core.scan import Source
from air_transfer.extend import strategies
from tests.support import live_chunks, rewriters
from tests.support.rewriters import (
    CHANGED,
    CHUNK,
    HOW,
    RewriteOnce,
    install_in_agent,
    local_scan,
    make_source,
    read_all,
    rewrite,
)
from tests.support.trees import assert_same_tree

pytestmark = pytest.mark.usefixtures("ray_local")
# The hooks run in the node agent too: ship their code by value.
ray.cloudpickle.register_pickle_by_value(rewriters)

STRATEGIES = sorted(strategies)


def config_for(strategy: str, **changes: Any) -> TransferConfig:
    return TransferConfig(chunk_bytes=CHUNK, window=512, strategy=strategy, **changes)


def nothing_published(out: Path) -> bool:
    return not out.exists() and not [p for p in os.listdir(out.parent) if "staging" in p]


@pytest.fixture
def in_agent() -> Iterator[Callable[[Any], None]]:
    """Install a hook in this node's agent (cleared after the test)."""
    agent = node_agent()
    yield lambda hook: install_in_agent(agent, hook)
    install_in_agent(agent, None)


# -- a same-size rewrite in place, wherever the bytes are read -------------------------
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_torn_pack_same_size_rewrite_while_packed_in_the_caller(
    tmp_path: Path,
    strategy: str,
    in_driver: Callable[[Any], None],
    in_agent: Callable[[Any], None],
) -> None:
    """owner="caller": the built-in strategies read in this node's agent (one task
    per chunk, owned by the caller), a custom one in the caller itself."""
    src = make_source(tmp_path)
    in_driver(RewriteOnce("w.bin", offset=8 * KiB))  # mid-file: chunks 1-2 are read
    in_agent(RewriteOnce("w.bin", offset=8 * KiB))
    with pytest.raises(SourceChangedError, match=CHANGED) as e:
        ChunkedCheckpoint.from_directory(src).to_object_ref(config=config_for(strategy))
    assert e.value.filename == str(src / "w.bin") and e.value.errno is not None


@pytest.mark.parametrize("strategy", ["inline", "chunked", "streamed"])
def test_torn_pack_same_size_rewrite_while_packed_by_the_node_agent(
    tmp_path: Path, strategy: str, in_agent: Callable[[Any], None]
) -> None:
    src = make_source(tmp_path)
    in_agent(RewriteOnce("w.bin", offset=8 * KiB))
    with pytest.raises(SourceChangedError, match=CHANGED):
        ChunkedCheckpoint.from_directory(src).to_object_ref(
            config=config_for(strategy, owner="node")
        )


@pytest.mark.parametrize("verify", [True, False])
def test_torn_pack_same_size_rewrite_while_streamed_at_transfer_time(
    tmp_path: Path, verify: bool, in_agent: Callable[[Any], None]
) -> None:
    src = make_source(tmp_path)
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(
        config=config_for("streamed", verify=verify)
    )
    in_agent(RewriteOnce("w.bin", offset=8 * KiB))  # the agent reads at transfer time
    out = tmp_path / "out"
    with pytest.raises(SourceChangedError, match=CHANGED):
        ChunkedCheckpoint.from_object_ref(ref).to_directory(out)
    assert nothing_published(out)


@pytest.mark.parametrize("how", HOW)
def test_streamed_file_rewritten_after_packing_is_caught_even_unverified(
    tmp_path: Path, how: str
) -> None:
    """Without verification no checksum would notice: the stamps taken at packing do."""
    src = make_source(tmp_path)
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(
        config=config_for("streamed", verify=False)
    )
    rewrite(str(src / "w.bin"), how)
    out = tmp_path / "out"
    word = "replaced by another file" if how == "rename" else "changed after"
    with pytest.raises(SourceChangedError, match=rf"w\.bin' (was )?{word}"):
        ChunkedCheckpoint.from_object_ref(ref).to_directory(out)
    assert nothing_published(out)


# -- what the checks see -----------------------------------------------------------------
def test_torn_pack_mtime_put_back_after_a_rewrite_is_caught_by_ctime(
    tmp_path: Path, in_driver: Callable[[Any], None], in_agent: Callable[[Any], None]
) -> None:
    src = make_source(tmp_path)
    # One chunk holds all of w.bin: no other packing thread reads it between the
    # rewrite and its utime. The blocking call packs every other chunk itself.
    in_driver(RewriteOnce("w.bin", how="utime-reset"))
    in_agent(RewriteOnce("w.bin", how="utime-reset"))
    with pytest.raises(SourceChangedError, match=CHANGED) as e:
        ChunkedCheckpoint.from_directory(src).to_object_ref(
            config=config_for("chunked").replace(chunk_bytes=64 * KiB)
        )
    assert "ctime_ns" in str(e.value) and "mtime_ns" not in str(e.value)


def test_torn_pack_file_renamed_over_while_packed_is_caught(
    tmp_path: Path, in_driver: Callable[[Any], None], in_agent: Callable[[Any], None]
) -> None:
    """The open fd keeps the old inode (its bytes are intact), but the source now has
    another file under that name: the old inode's link count dropped to 0."""
    src = make_source(tmp_path)
    # One chunk holds all of w.bin, so one read of it is followed by the rename (with
    # several, a concurrent packing thread may open the new file: "a new inode").
    in_driver(RewriteOnce("w.bin", how="rename"))
    in_agent(RewriteOnce("w.bin", how="rename"))
    with pytest.raises(SourceChangedError, match=CHANGED) as e:
        ChunkedCheckpoint.from_directory(src).to_object_ref(
            config=config_for("chunked").replace(chunk_bytes=64 * KiB)
        )
    assert "nlink" in str(e.value)


def test_torn_pack_concurrent_writer_never_yields_mixed_bytes(tmp_path: Path) -> None:
    """A real writer rewrites the file (two versions, one write each) as fast as it
    can while it is packed: packing either raises or carries one whole version."""
    src = tmp_path / "src"
    src.mkdir()
    versions = [os.urandom(256 * KiB), os.urandom(256 * KiB)]
    (src / "w.bin").write_bytes(versions[0])
    stop = threading.Event()
    fd = os.open(src / "w.bin", os.O_WRONLY)

    def write_forever() -> None:
        i = 0
        while not stop.is_set():
            i ^= 1
            os.pwrite(fd, versions[i], 0)

    writer = threading.Thread(target=write_forever, daemon=True)
    writer.start()
    outcomes = []
    try:
        for attempt in range(3):
            try:
                ref = ChunkedCheckpoint.from_directory(src).to_object_ref(
                    config=config_for("chunked")
                )
            except SourceChangedError as e:
                assert str(src / "w.bin") in str(e)
                outcomes.append("refused")
                continue
            out = tmp_path / f"out{attempt}"
            ChunkedCheckpoint.from_object_ref(ref).to_directory(out)
            assert (out / "w.bin").read_bytes() in versions, "torn: bytes of neither version"
            outcomes.append("whole")
    finally:
        stop.set()
        writer.join()
        os.close(fd)
    assert len(outcomes) == 3


# -- with live chunks reused (reuse_chunks) ------------------------------------------------
def test_a_file_changed_while_packed_is_still_source_changed_with_reuse(
    tmp_path: Path, in_agent: Callable[[Any], None]
) -> None:
    """Reused chunks do not hide a rewrite mid-pack of a file packed again; the next
    transfer packs that file anew and reuses the others."""
    src = live_chunks.make_tree(tmp_path)
    _first, first_ids = live_chunks.transfer(src)  # held: the agent keeps its chunks
    rewrite(str(src / "w.bin"), "in-place")
    in_agent(RewriteOnce("w.bin", offset=live_chunks.CHUNK))
    with pytest.raises(SourceChangedError, match=CHANGED):
        live_chunks.transfer(src)
    in_agent(None)
    third, third_ids = live_chunks.transfer(src)
    assert live_chunks.same(first_ids, third_ids) == live_chunks.chunks_of(
        {"a.bin", "b.bin", "c.bin"}
    )
    assert_same_tree(src, live_chunks.restored(third, tmp_path, "out"))


@dataclass
class FailOnce:
    """Agent hook: the first read of ``name`` fails with EIO (its stamp unchanged)."""

    name: str
    fired: bool = False

    def __call__(self, where: str, span: Any) -> None:
        if not self.fired and os.path.basename(where) == self.name:
            self.fired = True
            raise OSError(errno.EIO, "injected read error", where)


def test_a_chunk_whose_packing_failed_is_packed_again(
    tmp_path: Path, in_agent: Callable[[Any], None]
) -> None:
    """A transfer whose packing of a chunk of ``w.bin`` failed is still held (its
    chunks recorded under the files' current stamps): the next one takes every chunk
    of it that was packed and packs again exactly the ones that failed."""
    src = live_chunks.make_tree(tmp_path)
    in_agent(FailOnce("w.bin"))
    failed = ChunkedCheckpoint.from_directory(str(src)).to_object_ref_async(live_chunks.REUSE)
    with pytest.raises(OSError, match="injected read error"):
        failed.result()
    in_agent(None)
    pending = ray.get(failed.ref).handle().pending
    good = {i for i, c in enumerate(ray.get(list(pending))) if isinstance(c, str)}
    assert len(good) < live_chunks.ALL
    before = live_chunks.counters()
    second, second_ids = live_chunks.transfer(src)
    packed = live_chunks.counters()["bytes_packed"] - before["bytes_packed"]
    assert live_chunks.same(live_chunks.chunk_ids(failed.ref), second_ids) == good
    assert packed == (live_chunks.ALL - len(good)) * live_chunks.CHUNK
    assert_same_tree(src, live_chunks.restored(second, tmp_path, "out"))


# -- one chunk at a time, anywhere ---------------------------------------------------------
@ray.remote
def _fill(source: Source, plan: ChunkPlan) -> np.ndarray:
    out = np.empty(plan.length, dtype=np.uint8)
    fill_chunk(source, plan, memoryview(out))
    return out


def test_a_chunk_is_filled_from_its_plan_alone_in_another_process(tmp_path: Path) -> None:
    src = make_source(tmp_path)
    source, scanned = local_scan(src)
    plans = list(plan_chunks(scanned.files, scanned.stamps, CHUNK))
    chunks = ray.get([_fill.remote(source, p) for p in reversed(plans)])[::-1]
    assert b"".join(c.tobytes() for c in chunks) == read_all(source, scanned)
    rewrite(str(src / "w.bin"), "in-place")
    with pytest.raises(SourceChangedError, match=CHANGED):
        ray.get(_fill.remote(source, plans[5]))
