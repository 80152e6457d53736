"""The two ends of a round trip: the producer or consumer process (``Endpoint``, a Ray
actor made remote on first use) and the driver's handle on one pair (``Ends``)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import xxhash

from air_transfer import _ray
from air_transfer.bench.sampler import Sampler, object_store_used, wait_for_store_at_most
from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.config import TransferConfig
from air_transfer.direct_io import DirectFileWriter, should_write_direct


def _extract_all(tar: tarfile.TarFile, target: str) -> None:
    # The "tar" filter keeps modes as legacy AIR did, without 3.12's DeprecationWarning.
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(target, filter="tar")
    else:  # pragma: no cover - Python without PEP 706
        tar.extractall(target)


#: Read size of ``cp-direct``.
COPY_PIECE_BYTES = 8 * 1024 * 1024
#: Piece size and page size for warming a process's mapping of the object store.
STORE_PIECE_BYTES = 64 * 1024 * 1024
PAGE_BYTES = 4096
#: How much of a node's store the warm-up maps: below Ray's default spilling threshold
#: (0.8), so warming never spills.
WARM_STORE_FRACTION = 0.7


def copy_direct(src: str, dst: str) -> str:
    """``shutil.copy2``, except that a file ``TransferConfig.direct_io`` would write
    around the page cache is written so here too (read in 8 MiB pieces)."""
    if not should_write_direct(os.path.getsize(src)):
        return shutil.copy2(src, dst)
    piece = np.empty(COPY_PIECE_BYTES, dtype=np.uint8)
    with open(src, "rb", buffering=0) as reader, DirectFileWriter(dst) as writer:
        while n := reader.readinto(piece):
            writer.write(memoryview(piece)[:n])
    shutil.copystat(src, dst)
    return dst


class Endpoint:
    """A producer or consumer process (a Ray actor with ``num_cpus=0``). Each method
    is one side of one contender and returns the seconds it spent, so a result
    also says whether packing or unpacking is the slow half."""

    def info(self) -> tuple[int, str]:
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def fill_store(self, fraction: float) -> list[Any]:
        """Put pieces adding up to ``fraction`` of this node's object store and return
        their refs: writing them maps every page of that much of the store into this
        process (see ``Ends.warm_store``)."""
        node_id = ray.get_runtime_context().get_node_id()
        (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
        target = int(node["Resources"].get("object_store_memory", 0) * fraction)
        piece = np.ones(min(STORE_PIECE_BYTES, max(target, 1)), dtype=np.uint8)
        return [ray.put(piece) for _ in range(target // len(piece))]

    def touch_store(self, refs: list[Any]) -> int:
        """Read one byte per page of each object (fetched to this node if need be),
        which maps those pages of this node's store into this process."""
        touched = 0
        for ref in refs:
            piece = ray.get(ref)
            touched += int(piece[::PAGE_BYTES].sum(dtype=np.int64))
            del piece
        return touched

    def copytree(self, src: str, out: str, direct_io: bool = False) -> float:
        """``shutil.copytree``; with ``direct_io``, large files as air-transfer writes
        them (``copy_direct``)."""
        start = time.perf_counter()
        shutil.copytree(
            src, out, symlinks=True, copy_function=copy_direct if direct_io else shutil.copy2
        )
        return time.perf_counter() - start

    def blob_pack(self, src: str) -> tuple[list[Any], float]:
        """What ``ray.air.Checkpoint.from_directory(p).to_dict()`` did before Ray 2.7:
        the whole directory tarred into memory, ``getvalue()`` copied, one put."""
        start = time.perf_counter()
        stream = io.BytesIO()
        with tarfile.open(fileobj=stream, mode="w", format=tarfile.PAX_FORMAT) as tar:
            tar.add(src, arcname="")
        checkpoint = {"fs_checkpoint": stream.getvalue()}
        del stream
        ref = ray.put(checkpoint)
        return [ref], time.perf_counter() - start

    def blob_unpack(self, packed: tuple[list[Any], float], out: str) -> tuple[float, float]:
        """``ray.get`` of the dict (a private copy of the bytes), then untar."""
        (ref,), pack_s = packed
        start = time.perf_counter()
        checkpoint = ray.get(ref)
        with tarfile.open(fileobj=io.BytesIO(checkpoint["fs_checkpoint"])) as tar:
            _extract_all(tar, out)
        return pack_s, time.perf_counter() - start

    def air_pack(self, src: str, config: TransferConfig) -> tuple[list[Any], float]:
        start = time.perf_counter()
        ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=config)
        return [ref], time.perf_counter() - start

    def air_unpack(self, packed: tuple[list[Any], float], out: str) -> tuple[float, float]:
        (ref,), pack_s = packed
        start = time.perf_counter()
        ChunkedCheckpoint.from_object_ref(ref).to_directory(out)
        return pack_s, time.perf_counter() - start

    def tune_unpack(self, pack_actor: Any, out: str) -> float:
        """The body of Tune's unpack task, run here so that its
        memory is sampled in a known process; the code is Ray's, unchanged."""
        start = time.perf_counter()
        _ray.tune_unpack(pack_actor, out)
        return time.perf_counter() - start

    def raw_prepare(self, chunk_bytes: int) -> None:
        self._template = np.frombuffer(bytearray(os.urandom(chunk_bytes)), dtype=np.uint8)

    def _raw_chunks(self, nbytes: int) -> Iterator[np.ndarray]:
        chunk = len(self._template)
        for index, offset in enumerate(range(0, nbytes, chunk)):
            self._template[:8] = np.frombuffer(index.to_bytes(8, "little"), dtype=np.uint8)
            yield self._template[: min(chunk, nbytes - offset)]

    def raw_put(self, nbytes: int) -> tuple[list[Any], float]:
        """One ``ray.put`` per chunk (each stamped with its index so no two objects
        are alike); ``ray.put`` copies, so the template is reused."""
        start = time.perf_counter()
        refs = [ray.put(chunk) for chunk in self._raw_chunks(nbytes)]
        return refs, time.perf_counter() - start

    def raw_expected(self, nbytes: int) -> list[str]:
        return [xxhash.xxh3_64_hexdigest(c) for c in self._raw_chunks(nbytes)]

    def raw_get(
        self, packed: tuple[list[Any], float], window: int
    ) -> tuple[list[Any], float, float]:
        """``ray.get`` in batches of ``window``, starting the pull of the next batch
        (``ray.wait(fetch_local=True, timeout=0)``) before hashing the current one."""
        refs, pack_s = packed
        start = time.perf_counter()
        digests = []
        for i in range(0, len(refs), window):
            upcoming = refs[i + window : i + 2 * window]
            if upcoming:
                ray.wait(upcoming, num_returns=len(upcoming), timeout=0, fetch_local=True)
            digests += [xxhash.xxh3_64_hexdigest(c) for c in ray.get(refs[i : i + window])]
        return digests, pack_s, time.perf_counter() - start


@functools.cache
def _endpoint_actor() -> Any:
    # Made remote on first use, not at import (what STYLE.md asks of Ray Tune).
    return ray.remote(num_cpus=0)(Endpoint)


@dataclass
class Ends:
    """A producer and a consumer actor, where they run, and the run's settings."""

    producer: Any
    consumer: Any
    producer_pid: int
    consumer_pid: int
    producer_node: str
    consumer_node: str
    config: TransferConfig
    sampler: Sampler | None = None
    transient: list[Any] = field(default_factory=list)

    @classmethod
    def start(cls, config: TransferConfig, cross_node: bool) -> Ends:
        """Two fresh actors; across nodes, pinned by the custom node resources."""
        actor = _endpoint_actor()
        producer = actor.options(resources={"node_a": 0.01} if cross_node else {}).remote()
        consumer = actor.options(resources={"node_b": 0.01} if cross_node else {}).remote()
        (p_pid, p_node), (c_pid, c_node) = ray.get([producer.info.remote(), consumer.info.remote()])
        return cls(producer, consumer, p_pid, c_pid, p_node, c_node, config)

    def warm_store(self) -> None:
        """Map most of the object store into both processes once, untimed.

        A process's first write or read of a page of the store's shared memory takes
        a page fault even though the raylet preallocated the page: measured here,
        packing 1 GB in a fresh process took 0.51 s (246k faults) against 0.16 s
        once mapped, bare puts 0.35 s against 0.08 s. A long-running training
        worker has paid that long before it checkpoints, and without this warm-up
        the contender measured first at a new size would pay it for the others.
        """
        before = object_store_used()
        refs = ray.get(self.producer.fill_store.remote(WARM_STORE_FRACTION))
        ray.get(self.consumer.touch_store.remote(refs))
        del refs
        # Wait for the pieces to go, so the first measurement's store baseline is clean.
        wait_for_store_at_most(before + STORE_PIECE_BYTES, timeout_s=10.0)

    def kill(self) -> None:
        for handle in [self.producer, self.consumer, *self.transient]:
            with contextlib.suppress(Exception):
                ray.kill(handle)
