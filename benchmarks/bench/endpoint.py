"""The two ends of a round trip: the producer or consumer process (``Endpoint``, a Ray
actor made remote on first use) and the driver's handle on one pair (``Ends``)."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import shutil
import tarfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
import xxhash

from air_transfer import ChunkedCheckpoint, TransferConfig, TransferFuture, node_agent
from air_transfer.core.direct_io import DirectFileWriter, should_write_direct
from benchmarks.bench import tune
from benchmarks.bench.data import timed_restore
from benchmarks.bench.sampler import Sampler, object_store_used, wait_for_store_at_most


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


def fill_store(fraction: float) -> list[Any]:
    """Put pieces adding up to ``fraction`` of this node's object store and return
    their refs: writing them maps every page of that much of the store into the
    calling process (see ``Ends.warm_store``)."""
    node_id = ray.get_runtime_context().get_node_id()
    (node,) = [n for n in ray.nodes() if n["NodeID"] == node_id]
    target = int(node["Resources"].get("object_store_memory", 0) * fraction)
    piece = np.ones(min(STORE_PIECE_BYTES, max(target, 1)), dtype=np.uint8)
    return [ray.put(piece) for _ in range(target // len(piece))]


def touch_store(refs: list[Any]) -> int:
    """Read one byte per page of each object (fetched to this node if need be),
    which maps those pages of this node's store into the calling process."""
    touched = 0
    for ref in refs:
        piece = ray.get(ref)
        touched += int(piece[::PAGE_BYTES].sum(dtype=np.int64))
        del piece
    return touched


def agent_fill_store(agent: object, fraction: float) -> list[list[Any]]:
    """``fill_store`` run inside a node agent (``agent.__ray_call__``): the agent packs
    every chunk now, so it is the process whose first writes to the store's pages
    fault. The refs come back nested, so the caller borrows them."""
    return [fill_store(fraction)]


class Endpoint:
    """A producer or consumer process (a Ray actor with ``num_cpus=0``). Each method
    is one side of one contender and returns the seconds it spent, so a result
    also says whether packing or unpacking is the slow half."""

    #: The transfer ``air_pack_async`` started: future, call time, done event and
    #: the time packing finished (filled in by the future's callback).
    _async: tuple[TransferFuture, float, threading.Event, list[float]] | None = None

    def info(self) -> tuple[int, str]:
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def fill_store(self, fraction: float) -> list[Any]:
        return fill_store(fraction)

    def touch_store(self, refs: list[Any]) -> int:
        return touch_store(refs)

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

    def air_pack_async(self, src: str, config: TransferConfig) -> tuple[list[Any], float]:
        """``to_object_ref_async``: returns once the call has, with the seconds the
        call blocked; packing goes on in the node's agent (``air_async_packed``)."""
        done = threading.Event()
        start = time.perf_counter()
        future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(config=config)
        call_s = time.perf_counter() - start
        packed_at: list[float] = []

        def record(_: TransferFuture) -> None:
            packed_at.append(time.perf_counter())
            done.set()

        future.add_done_callback(record)
        self._async = (future, start, done, packed_at)
        return [future.ref], call_s

    def air_async_packed(self, timeout_s: float = 600.0) -> float:
        """Seconds from the last ``air_pack_async`` call until its packing finished
        (the source directory was free again); raises what packing raised. Lets go of
        the future, so that only the readers' references keep the chunks."""
        state, self._async = self._async, None
        if state is None:
            raise RuntimeError("air_async_packed without a transfer in flight")
        future, start, done, packed_at = state
        future.result(timeout_s)
        if not done.wait(timeout_s):
            raise TimeoutError(f"packing finished but its callback did not run in {timeout_s} s")
        return packed_at[0] - start

    def air_unpack(self, packed: tuple[list[Any], float], out: str) -> tuple[float, float]:
        (ref,), pack_s = packed
        start = time.perf_counter()
        ChunkedCheckpoint.from_object_ref(ref).to_directory(out)
        return pack_s, time.perf_counter() - start

    def restore(self, checkpoint: Any, out: str) -> tuple[float, dict[str, Any]]:
        """``data.timed_restore`` in this process (its memory is sampled)."""
        return timed_restore(checkpoint, out)

    def tune_unpack(self, pack_actor: Any, out: str) -> float:
        """The body of Tune's unpack task, run here so that its
        memory is sampled in a known process; the code is Ray's, unchanged."""
        start = time.perf_counter()
        tune.tune_unpack(pack_actor, out)
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


def start_endpoint(resource: str | None = None) -> Any:
    """A fresh ``Endpoint`` actor, pinned to the node holding custom ``resource``."""
    return _endpoint_actor().options(resources={resource: 0.01} if resource else {}).remote()


def warm_agent(node_id: str, fraction: float, reader: Any = None) -> None:
    """Map ``fraction`` of node ``node_id``'s object store into that node's agent
    (which packs every chunk: ``to_object_ref`` and node-storage reads alike), and
    into ``reader`` too, an actor on the same node that then reads them, so that
    neither process pays first touches of store pages on the clock."""
    agent = node_agent(node_id)
    (refs,) = ray.get(agent.__ray_call__.remote(agent_fill_store, fraction))
    if reader is not None:
        ray.get(reader.touch_store.remote(refs))


def agent_pid(node_id: str) -> int:
    """The pid of node ``node_id``'s agent (started if need be)."""
    return int(ray.get(node_agent(node_id).pid.remote()))


@dataclass
class Ends:
    """A producer and a consumer actor, where they run, and the run's settings.
    ``agent_pid`` is the producer node's agent, which packs the chunks."""

    producer: Any
    consumer: Any
    producer_pid: int
    consumer_pid: int
    producer_node: str
    consumer_node: str
    config: TransferConfig
    agent_pid: int | None = None
    sampler: Sampler | None = None
    transient: list[Any] = field(default_factory=list)

    @classmethod
    def start(cls, config: TransferConfig, cross_node: bool) -> Ends:
        """Two fresh actors; across nodes, pinned by the custom node resources."""
        producer = start_endpoint("node_a" if cross_node else None)
        consumer = start_endpoint("node_b" if cross_node else None)
        (p_pid, p_node), (c_pid, c_node) = ray.get([producer.info.remote(), consumer.info.remote()])
        return cls(producer, consumer, p_pid, c_pid, p_node, c_node, config, agent_pid(p_node))

    def warm_store(self) -> None:
        """Map most of the object store into both processes and into the agent of
        each of their nodes once, untimed.

        A process's first write or read of a page of the store's shared memory takes
        a page fault even where the raylet preallocated the page (it no longer does:
        see ``session.PLASMA_CONFIG``; the first fill also allocates it): measured here,
        packing 1 GB in a fresh process took 0.51 s (246k faults) against 0.16 s
        once mapped, bare puts 0.35 s against 0.08 s. A long-running training
        worker has paid that long before it checkpoints, and without this warm-up
        the contender measured first at a new size would pay it for the others.
        The agents count too: they pack the chunks (``to_object_ref`` submits the
        packing to the node's agent) and serve node-storage reads.
        """
        before = object_store_used()
        refs = ray.get(self.producer.fill_store.remote(WARM_STORE_FRACTION))
        ray.get(self.consumer.touch_store.remote(refs))
        del refs
        # Wait for the pieces to go, so the next fill and the first measurement's
        # store baseline are clean.
        wait_for_store_at_most(before + STORE_PIECE_BYTES, timeout_s=10.0)
        for node in dict.fromkeys([self.producer_node, self.consumer_node]):
            same = self.consumer if node == self.consumer_node else None
            warm_agent(node, WARM_STORE_FRACTION, same)
            wait_for_store_at_most(before + STORE_PIECE_BYTES, timeout_s=10.0)

    def kill(self) -> None:
        for handle in [self.producer, self.consumer, *self.transient]:
            with contextlib.suppress(Exception):
                ray.kill(handle)
