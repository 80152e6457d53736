"""``python -m air_transfer bench``: checkpoint transfer contenders side by side.

Every contender makes the same round trip: a *producer* process packs a checkpoint
directory, a different *consumer* process fetches it and writes it back out as files.
The output is verified byte for byte against the source, then deleted. The contenders:

- ``cp``: ``shutil.copytree`` in the consumer, no Ray at all: the floor.
- ``blob``: the legacy AIR path that ray-project/ray#25217 measured: the directory
  tarred into one ``bytes``, one ``ray.put``, one ``ray.get``, untar.
- ``tune``: Ray Tune's own ``ray.tune.utils.file_transfer`` (``_PackActor`` and
  ``_unpack_from_actor``), as ``sync_dir_between_nodes`` uses them.
- every registered air-transfer strategy (``inline``, ``chunked``, ...).
- ``raw`` (default with ``--cross-node``): the same number of bytes as numpy chunks,
  ``ray.put`` by the producer and ``ray.get`` by the consumer, no files: Ray's own
  transfer ceiling.

What is measured, and how:

- seconds: wall clock in the driver around the whole round trip (``perf_counter``).
  For ``tune`` this includes starting the pack actor, as every Tune sync does.
- peak private memory: the high water of ``RssAnon`` in ``/proc/<pid>/status`` of the
  producer and of the consumer process, sampled every 20 ms by a driver thread.
  Plain RSS would also count the object-store pages a process maps (a zero-copy
  ``ray.get`` maps the whole object), which are not private and not the process's.
- object store: ``cluster_resources() - available_resources()`` of
  ``object_store_memory``, summed over nodes, sampled every 20 ms, minus its value
  when the measurement started. Raylets report it every ~100 ms (a 100 MiB put
  shows up about 90 ms later), so a peak shorter than that can be missed; the driver
  keeps a finished trip's objects referenced for 250 ms (untimed) so they are seen.

Repeats are interleaved (rep 1 of every contender, then rep 2) so a machine that
drifts, a disk slowed by someone else's load, does not land on one contender; each
contender has its own producer/consumer actor pair per layout, warmed up by one
untimed 1 MiB round trip (``--no-warmup`` to measure first-use costs too).

A contender whose predicted memory would not fit (``blob`` needs ~8x the checkpoint,
``tune`` ~6x) is skipped with the reason, never run into the OOM killer; a watchdog
also kills a run if available memory falls under half the margin anyway.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import logging
import math
import os
import platform
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import ray
import xxhash

import air_transfer
from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.config import MiB, TransferConfig
from air_transfer.strategies import strategies as registered_strategies

GB = 10**9
GiB = 1024 * MiB
#: Blocks in which random checkpoint data is generated and streamed for hashing.
IO_BLOCK = 64 * MiB
SAMPLE_INTERVAL_S = 0.02
#: How long the driver keeps a finished round trip's objects referenced, so that the
#: object-store sampler sees them even when the trip was shorter than the raylets'
#: ~100 ms report period.
HOLD_S = 0.25
#: Size of the untimed warm-up round trip each fresh actor pair makes first.
WARMUP_BYTES = 1 * MiB
#: Predicted peak memory (private + object store) as a multiple of the checkpoint.
#: blob: the tar stream, its ``getvalue`` copy, the pickled put, the object and the
#: consumer's copy; ray-project/ray#25217 reported ~8x, this bench measured ~7x at
#: 0.5 GB (producer 2.5 GiB + consumer 0.6 + store 0.5). tune: the pack actor holds
#: the tar ``BytesIO`` and a ``read()`` copy of each chunk, the unpacking side a
#: chunk copy and its own ``BytesIO``, plus the chunk in the store: ~5.5x measured
#: at 0.5 GB (1.0 + 1.0 + 0.5 GiB); predicted with headroom.
BLOB_MEMORY_FACTOR = 8
TUNE_MEMORY_FACTOR = 6
#: Raylets fault their whole object store in at start (a production setting), so the
#: first contender to fill it does not pay the store's first-touch cost for the rest.
PLASMA_CONFIG = {"preallocate_plasma_memory": True}
LAYOUTS = ("big", "small", "mixed")
BUILTIN_CONTENDERS = ("cp", "blob", "tune")
RAW = "raw"


def all_contenders() -> list[str]:
    """Every contender name: the built-ins, each registered strategy, and ``raw``."""
    return [*BUILTIN_CONTENDERS, *registered_strategies, RAW]


def default_contenders(cross_node: bool) -> list[str]:
    """What runs without ``--contenders``: all of them, ``raw`` only across nodes,
    where it is the ceiling the others are judged against."""
    return [c for c in all_contenders() if c != RAW or cross_node]


# -- checkpoint data ---------------------------------------------------------------------


def layout_plan(layout: str, size_bytes: int, small_file_bytes: int) -> tuple[list, list]:
    """``(files, empty_dirs)`` for a checkpoint of about ``size_bytes``: files as
    ``(relative path, bytes)``. ``big`` is one model file, ``small`` is many files of
    ``small_file_bytes`` (100 per directory), ``mixed`` is half one big file, a
    quarter in 8 shards, a quarter in small files, plus an empty file and directory."""
    if layout == "big":
        return [("model.bin", size_bytes)], []
    if layout == "small":
        count = max(1, round(size_bytes / small_file_bytes))
        return [(f"d{i // 100:04d}/f{i:06d}.bin", small_file_bytes) for i in range(count)], []
    if layout != "mixed":
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    big, shard = size_bytes // 2, size_bytes // 32
    files = [("model.bin", big)] + [(f"shards/shard-{i}.bin", shard) for i in range(8)]
    rest = size_bytes - big - 8 * shard
    count = max(1, rest // small_file_bytes)
    sizes = [small_file_bytes] * (count - 1) + [rest - (count - 1) * small_file_bytes]
    files += [(f"small/s{i // 100:04d}/f{i:06d}.bin", n) for i, n in enumerate(sizes)]
    return [*files, ("meta/empty.txt", 0)], ["logs"]


def checkpoint_key(layout: str, size_bytes: int, small_file_bytes: int) -> str:
    """The cache directory name of one checkpoint: layout, size, small-file size."""
    key = f"{layout}-{size_bytes}B"
    return key if layout == "big" else f"{key}-{small_file_bytes // 1024}KiB"


_CACHE_NAME = re.compile(r"^\.?(big|small|mixed)-\d+B(-\d+KiB)?(\.partial-\d+)?$|^out$")


def make_checkpoint(data_dir: str, layout: str, size_bytes: int, small_file_bytes: int) -> str:
    """The path of a random-data checkpoint, written once and cached in ``data_dir``.

    Written under a ``.partial`` name and renamed when complete, so an interrupted run
    never leaves a truncated checkpoint to be reused.
    """
    key = checkpoint_key(layout, size_bytes, small_file_bytes)
    path = os.path.join(data_dir, key)
    if os.path.isdir(path):
        return path
    partial = os.path.join(data_dir, f".{key}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    files, empty_dirs = layout_plan(layout, size_bytes, small_file_bytes)
    for relpath, nbytes in files:
        target = os.path.join(partial, relpath)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        _write_random(target, nbytes)
    for relpath in empty_dirs:
        os.makedirs(os.path.join(partial, relpath), exist_ok=True)
    os.rename(partial, path)
    return path


def _write_random(path: str, nbytes: int) -> None:
    """Incompressible bytes, ``IO_BLOCK`` at a time: never the whole file in memory."""
    with open(path, "wb") as f:
        for offset in range(0, nbytes, IO_BLOCK):
            f.write(os.urandom(min(IO_BLOCK, nbytes - offset)))


def clean_data_dir(data_dir: str) -> list[str]:
    """Delete the cached checkpoints and outputs this bench made in ``data_dir`` (and
    nothing else there); returns what was removed."""
    if not os.path.isdir(data_dir):
        return []
    removed = [n for n in os.listdir(data_dir) if _CACHE_NAME.match(n)]
    for name in removed:
        shutil.rmtree(os.path.join(data_dir, name), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(data_dir)  # only if now empty
    return removed


# -- verification ------------------------------------------------------------------------


def tree_digest(root: str) -> dict[str, tuple[str, int, str]]:
    """``relative path -> (kind, size, xxh3 of the content)`` for every directory and
    file under ``root``; content is streamed, never held whole."""
    digest: dict[str, tuple[str, int, str]] = {}
    buffer = bytearray(8 * MiB)
    for dirpath, dirnames, filenames in os.walk(root):
        rel = os.path.relpath(dirpath, root)
        for name in dirnames:
            digest[os.path.normpath(os.path.join(rel, name))] = ("dir", 0, "")
        for name in filenames:
            digest[os.path.normpath(os.path.join(rel, name))] = _file_digest(
                os.path.join(dirpath, name), buffer
            )
    return digest


def _file_digest(path: str, buffer: bytearray) -> tuple[str, int, str]:
    h, size, view = xxhash.xxh3_64(), 0, memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(view):
            h.update(view[:n])
            size += n
    return "file", size, h.hexdigest()


def first_difference(expected: dict, actual: dict) -> str | None:
    """A readable description of the first way ``actual`` differs, or None."""
    for path in sorted(expected.keys() | actual.keys()):
        want, got = expected.get(path), actual.get(path)
        if want != got:
            if got is None:
                return f"{path!r} is missing from the output"
            if want is None:
                return f"{path!r} is in the output but not in the source"
            return f"{path!r} differs: source {want[:2]}, output {got[:2]} (or content hash)"
    return None


# -- memory ------------------------------------------------------------------------------


def private_bytes(pid: int) -> int | None:
    """``RssAnon`` of ``pid`` in bytes (None once it has exited): the anonymous
    memory it has touched, without the object-store pages it maps."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


def object_store_used() -> int:
    """Bytes used in the object store, summed over nodes, as raylets last reported."""
    total = ray.cluster_resources().get("object_store_memory", 0)
    return int(total - ray.available_resources().get("object_store_memory", 0))


class Sampler:
    """Samples the peak private memory of the watched processes and the object
    store's use every ``SAMPLE_INTERVAL_S`` in a background thread.

    If available memory falls under ``floor_bytes`` it calls ``on_low`` once (which
    kills the run's actors) and sets ``aborted``, instead of waiting for the kernel's
    OOM killer to pick a victim, maybe the Ray head.
    """

    def __init__(self, pids: dict[str, int | None], floor_bytes: int, on_low: Callable) -> None:
        self._pids = {role: pid for role, pid in pids.items() if pid}
        self._floor, self._on_low = floor_bytes, on_low
        self.peaks: dict[str, int] = {}
        self._store_base = object_store_used()
        self.store_peak = 0
        self.aborted = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-sampler", daemon=True)

    def watch(self, role: str, pid: int | None) -> None:
        """Also sample ``pid`` as ``role`` (a process started during the run)."""
        if pid:
            self._pids[role] = pid
            self._sample()

    def __enter__(self) -> Sampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def _run(self) -> None:
        tick = 0
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self._sample()
            tick += 1
            if tick % 5 == 0 and not self.aborted:
                self._check_available()

    def _sample(self) -> None:
        for role, pid in list(self._pids.items()):
            used = private_bytes(pid)
            if used is not None:
                self.peaks[role] = max(self.peaks.get(role, 0), used)
        with contextlib.suppress(Exception):  # a GCS hiccup must not end the sampling
            self.store_peak = max(self.store_peak, object_store_used() - self._store_base)

    def _check_available(self) -> None:
        if psutil.virtual_memory().available < self._floor:
            self.aborted = True
            self._on_low()

    def settle(self, timeout_s: float = 3.0) -> None:
        """Wait (briefly) until the run's objects are freed, so the next run starts
        from the same object-store baseline."""
        deadline = time.monotonic() + timeout_s
        while object_store_used() > self._store_base + MiB and time.monotonic() < deadline:
            time.sleep(0.05)


def predicted_peak_bytes(
    contender: str, size_bytes: int, config: TransferConfig, store_bytes: int | None = None
) -> int:
    """Memory (private + object store) one round trip of ``contender`` is expected to
    need on this machine for a checkpoint of ``size_bytes``.

    Chunked contenders hold a few chunks privately and the checkpoint in the object
    store, which is capped by its capacity (``store_bytes``; Ray spills the rest to
    disk). ``cp`` needs only the page cache, which the kernel can always reclaim.
    """
    in_store = size_bytes if store_bytes is None else min(size_bytes, store_bytes)
    if contender == "cp":
        return 0
    if contender == "blob":
        return BLOB_MEMORY_FACTOR * size_bytes
    if contender == "tune":
        return TUNE_MEMORY_FACTOR * size_bytes
    if contender == "inline":
        return 3 * size_bytes
    if contender == RAW:
        return in_store + 2 * config.window * config.chunk_bytes
    return in_store + 2 * (config.window + 3) * config.chunk_bytes


def skip_reason(
    contender: str,
    size_bytes: int,
    config: TransferConfig,
    available_bytes: int,
    margin_bytes: int,
    store_bytes: int | None = None,
) -> str | None:
    """Why ``contender`` must not run at ``size_bytes`` here, or None if it may."""
    if contender == "inline" and size_bytes > config.inline_limit:
        return (
            f"'inline' carries at most inline_limit={config.inline_limit / MiB:g} MiB "
            f"(window x chunk size bound); this checkpoint is {size_bytes / MiB:.0f} MiB"
        )
    need = predicted_peak_bytes(contender, size_bytes, config, store_bytes)
    if need > available_bytes - margin_bytes:
        return (
            f"predicted peak memory {need / GiB:.1f} GiB for {contender!r} exceeds the "
            f"{available_bytes / GiB:.1f} GiB available minus a {margin_bytes / GiB:.1f} GiB "
            "margin; skipped instead of risking the OOM killer"
        )
    return None


# -- the two ends of a round trip --------------------------------------------------------


def _extract_all(tar: tarfile.TarFile, target: str) -> None:
    # The "tar" filter keeps modes as legacy AIR did, without 3.12's DeprecationWarning.
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(target, filter="tar")
    else:  # pragma: no cover - Python without PEP 706
        tar.extractall(target)


class Endpoint:
    """A producer or consumer process (a Ray actor with ``num_cpus=0``). Each method
    is one side of one contender and returns the seconds it spent, so a result
    also says whether packing or unpacking is the slow half."""

    def info(self) -> tuple[int, str]:
        return os.getpid(), ray.get_runtime_context().get_node_id()

    def copytree(self, src: str, out: str) -> float:
        start = time.perf_counter()
        shutil.copytree(src, out, symlinks=True)
        return time.perf_counter() - start

    def blob_pack(self, src: str) -> tuple[list, float]:
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

    def blob_unpack(self, packed: tuple[list, float], out: str) -> tuple[float, float]:
        """``ray.get`` of the dict (a private copy of the bytes), then untar."""
        (ref,), pack_s = packed
        start = time.perf_counter()
        checkpoint = ray.get(ref)
        with tarfile.open(fileobj=io.BytesIO(checkpoint["fs_checkpoint"])) as tar:
            _extract_all(tar, out)
        return pack_s, time.perf_counter() - start

    def air_pack(self, src: str, config: TransferConfig) -> tuple[list, float]:
        start = time.perf_counter()
        ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config=config)
        return [ref], time.perf_counter() - start

    def air_unpack(self, packed: tuple[list, float], out: str) -> tuple[float, float]:
        (ref,), pack_s = packed
        start = time.perf_counter()
        ChunkedCheckpoint.from_object_ref(ref).to_directory(out)
        return pack_s, time.perf_counter() - start

    def tune_unpack(self, pack_actor: Any, out: str) -> float:
        """The body of Tune's ``_unpack_from_actor`` task, run here so that its
        memory is sampled in a known process; the code is Ray's, unchanged."""
        from ray.tune.utils.file_transfer import _unpack_from_actor

        start = time.perf_counter()
        _unpack_from_actor._function(pack_actor, out)
        return time.perf_counter() - start

    def raw_prepare(self, chunk_bytes: int) -> None:
        self._template = np.frombuffer(bytearray(os.urandom(chunk_bytes)), dtype=np.uint8)

    def _raw_chunks(self, nbytes: int) -> Iterator[np.ndarray]:
        chunk = len(self._template)
        for index, offset in enumerate(range(0, nbytes, chunk)):
            self._template[:8] = np.frombuffer(index.to_bytes(8, "little"), dtype=np.uint8)
            yield self._template[: min(chunk, nbytes - offset)]

    def raw_put(self, nbytes: int) -> tuple[list, float]:
        """One ``ray.put`` per chunk (each stamped with its index so no two objects
        are alike); ``ray.put`` copies, so the template is reused."""
        start = time.perf_counter()
        refs = [ray.put(chunk) for chunk in self._raw_chunks(nbytes)]
        return refs, time.perf_counter() - start

    def raw_expected(self, nbytes: int) -> list[str]:
        return [xxhash.xxh3_64_hexdigest(c) for c in self._raw_chunks(nbytes)]

    def raw_get(self, packed: tuple[list, float], window: int) -> tuple[list, float, float]:
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
    transient: list = field(default_factory=list)

    @classmethod
    def start(cls, config: TransferConfig, cross_node: bool) -> Ends:
        """Two fresh actors; across nodes, pinned by the custom node resources."""
        actor = _endpoint_actor()
        producer = actor.options(resources={"node_a": 0.01} if cross_node else {}).remote()
        consumer = actor.options(resources={"node_b": 0.01} if cross_node else {}).remote()
        (p_pid, p_node), (c_pid, c_node) = ray.get([producer.info.remote(), consumer.info.remote()])
        return cls(producer, consumer, p_pid, c_pid, p_node, c_node, config)

    def kill(self) -> None:
        for handle in [self.producer, self.consumer, *self.transient]:
            with contextlib.suppress(Exception):
                ray.kill(handle)


# -- contenders: one function each -------------------------------------------------------


@dataclass
class Trip:
    """One timed round trip. ``verified`` is set by contenders without output files;
    ``hold`` keeps the trip's objects referenced until the sampler has seen them."""

    seconds: float
    pack_s: float | None = None
    unpack_s: float | None = None
    verified: bool | None = None
    hold: Any = None


def run_cp(ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """The floor: a local ``shutil.copytree`` in the consumer (also across nodes,
    where no Ray transfer can beat the local disk)."""
    start = time.perf_counter()
    unpack_s = ray.get(ends.consumer.copytree.remote(src, out))
    return Trip(time.perf_counter() - start, None, unpack_s)


def run_blob(ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """The one-blob path whose superlinear time and ~8x memory ray-project/ray#25217
    reported."""
    start = time.perf_counter()
    packed = ends.producer.blob_pack.remote(src)
    pack_s, unpack_s = ray.get(ends.consumer.blob_unpack.remote(packed, out))
    return Trip(time.perf_counter() - start, pack_s, unpack_s, hold=packed)


def run_tune(ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """Ray Tune's cross-node sync, as ``_sync_dir_between_different_nodes`` does it
    with ``force_all=True``: a ``_PackActor`` on the source node tars the directory
    in its constructor, the target side pulls 500 MiB chunks and untars.

    ``max_size_bytes=None`` lifts Tune's 1 GiB default refusal so larger sizes can be
    measured at all.
    """
    from ray.tune.utils import file_transfer as ft

    start = time.perf_counter()
    pack_actor = ft._PackActor.options(num_cpus=0, **ft._force_on_node(ends.producer_node)).remote(
        source_dir=src,
        files_stats=None,
        chunk_size_bytes=ft._DEFAULT_CHUNK_SIZE_BYTES,
        max_size_bytes=None,
    )
    ends.transient.append(pack_actor)
    done = ends.consumer.tune_unpack.remote(pack_actor, out)
    try:
        if ends.sampler is not None:
            ends.sampler.watch("producer", _actor_pid(pack_actor))
        ray.get(done)
        # No phase times: the consumer's first fetch waits for the whole tar to be built.
        return Trip(time.perf_counter() - start)
    finally:
        ray.kill(pack_actor)  # what dropping the handle in sync_dir_between_nodes does
        ends.transient.remove(pack_actor)


def _actor_pid(handle: Any, timeout_s: float = 30.0) -> int | None:
    """The pid of an actor still in its constructor: the GCS actor table has it as
    soon as a worker is leased, long before the actor is ALIVE."""
    from ray._private import state as ray_state

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = ray_state.actors(handle._actor_id.hex()).get("Pid")
        if pid:
            return int(pid)
        time.sleep(0.01)
    return None


def run_strategy(name: str, ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """An air-transfer strategy through the public API: ``to_object_ref`` in the
    producer, ``from_object_ref(...).to_directory`` in the consumer."""
    config = ends.config.replace(strategy=name)
    start = time.perf_counter()
    packed = ends.producer.air_pack.remote(src, config)
    pack_s, unpack_s = ray.get(ends.consumer.air_unpack.remote(packed, out))
    return Trip(time.perf_counter() - start, pack_s, unpack_s, hold=packed)


def run_raw(ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """Ray's own ceiling: ``nbytes`` in chunk-size numpy arrays put and got, no
    files on either side; verified by comparing per-chunk hashes."""
    ray.get(ends.producer.raw_prepare.remote(ends.config.chunk_bytes))
    start = time.perf_counter()
    packed = ends.producer.raw_put.remote(nbytes)
    digests, pack_s, unpack_s = ray.get(ends.consumer.raw_get.remote(packed, ends.config.window))
    seconds = time.perf_counter() - start
    expected = ray.get(ends.producer.raw_expected.remote(nbytes))
    return Trip(seconds, pack_s, unpack_s, verified=digests == expected, hold=packed)


def contender_function(name: str) -> Callable[[Ends, str, str, int], Trip]:
    """The function that runs ``name`` once."""
    builtins = {"cp": run_cp, "blob": run_blob, "tune": run_tune, RAW: run_raw}
    if name in builtins:
        return builtins[name]
    if name in registered_strategies:
        return functools.partial(run_strategy, name)
    raise ValueError(f"unknown contender {name!r}; known: {', '.join(all_contenders())}")


# -- running -----------------------------------------------------------------------------


def progress(message: str) -> None:
    """One line on stderr, flushed, so a long run is never silent."""
    print(message, file=sys.stderr, flush=True)


@contextlib.contextmanager
def ray_session(cross_node: bool, num_cpus: int, store_bytes: int) -> Iterator[str]:
    """An embedded Ray for the run: one local node, or with ``cross_node`` a two-node
    ``ray.cluster_utils.Cluster`` on this machine (resources ``node_a``, ``node_b``),
    each node with its own object store of ``store_bytes``. An already initialized
    Ray (single node only) is reused and left running."""
    if ray.is_initialized():
        if cross_node:
            raise RuntimeError("--cross-node starts its own 2-node cluster: call ray.shutdown()")
        yield "reused the running Ray"
        return
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    quiet = {"logging_level": logging.ERROR, "log_to_driver": False}
    cluster = None
    if cross_node:
        from ray.cluster_utils import Cluster

        node = {"num_cpus": num_cpus, "object_store_memory": store_bytes}
        cluster = Cluster(
            initialize_head=True,
            head_node_args={
                **node,
                "resources": {"node_a": 1},
                "include_dashboard": False,
                "_system_config": PLASMA_CONFIG,
            },
        )
        cluster.add_node(**node, resources={"node_b": 1})
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, **quiet)
    else:
        # "local": always a fresh instance, never a cluster someone started with `ray start`.
        ray.init(
            address="local",
            num_cpus=num_cpus,
            include_dashboard=False,
            object_store_memory=store_bytes,
            _system_config=PLASMA_CONFIG,
            **quiet,
        )
    try:
        yield "2-node cluster" if cross_node else "local Ray"
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()


def prefault_memory(margin_bytes: int) -> None:
    """Touch all available memory but ``margin_bytes`` once, in a child process that
    then exits, so that no measurement pays a VM's first-touch cost (see --no-prefault).
    It also evicts the page cache; the checkpoints are read (digested) afterwards."""
    nbytes = max(0, psutil.virtual_memory().available - margin_bytes)
    code = (
        "import mmap, sys\n"
        "n = int(sys.argv[1]); m = mmap.mmap(-1, n)\n"
        "for off in range(0, n, 1 << 30):\n"
        "    m[off:off + min(1 << 30, n - off)] = b'\\1' * min(1 << 30, n - off)\n"
    )
    subprocess.run([sys.executable, "-c", code, str(nbytes)], check=True)


def auto_store_bytes(largest_bytes: int, cross_node: bool) -> int:
    """Object store per node: room for the largest checkpoint 1.5 times over, at most
    30% of memory (20% per node across nodes) and never under 256 MiB."""
    total = psutil.virtual_memory().total
    cap = int(total * (0.2 if cross_node else 0.3))
    return max(256 * MiB, min(int(1.5 * largest_bytes) + 256 * MiB, cap))


def _drop_caches() -> bool:
    """Flush dirty pages and drop the page cache (needs root); False if not allowed."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        return False
    return True


def _error_reason(error: BaseException, aborted: bool, floor_bytes: int) -> str:
    if aborted:
        return (
            f"aborted: available memory fell under {floor_bytes / GiB:.1f} GiB, "
            "its actors were killed"
        )
    cause = getattr(error, "cause", None) or error
    lines = [line for line in str(cause).strip().splitlines() if line.strip()]
    return f"{type(cause).__name__}: {lines[-1] if lines else ''}"[:400]


@dataclass
class Measurement:
    trip: Trip | None
    error: str | None
    peaks: dict[str, int]
    store_peak: int


def measure_once(
    name: str, ends: Ends, src: str, out: str, nbytes: int, source: dict, opts: argparse.Namespace
) -> Measurement:
    """One sampled, verified round trip of contender ``name``; the output is deleted."""
    # Write back dirty pages first (untimed): data just generated, or written by the
    # previous trip, must not be flushed on this trip's clock.
    os.sync()
    if opts.drop_caches:
        _drop_caches()  # cold start: the source is read from disk, not the page cache
    floor = int(opts.memory_margin_gb * GB / 2)
    pids = {"producer": None if name == "cp" else ends.producer_pid, "consumer": ends.consumer_pid}
    trip, error = None, None
    with Sampler(pids, floor, ends.kill) as sampler:
        ends.sampler = sampler
        try:
            trip = contender_function(name)(ends, src, out, nbytes)
            if trip.hold is not None:
                time.sleep(HOLD_S)
                trip.hold = None
        except Exception as e:
            error = _error_reason(e, sampler.aborted, floor)
        finally:
            ends.sampler = None
    if trip is not None and trip.verified is None:
        difference = first_difference(source, tree_digest(out)) if os.path.isdir(out) else None
        trip.verified = os.path.isdir(out) and difference is None
        if not trip.verified:
            error = f"output differs from the source: {difference or 'no output directory'}"
    elif trip is not None and not trip.verified:
        error = "the consumer's chunk hashes differ from the producer's"
    shutil.rmtree(out, ignore_errors=True)
    sampler.settle()
    return Measurement(trip, error, dict(sampler.peaks), sampler.store_peak)


def _mib(value: int | None) -> float | None:
    return None if value is None else round(value / MiB, 1)


def summarize(
    name: str, layout: str, size_gb: float, nbytes: int, runs: list[Measurement]
) -> dict[str, Any]:
    """One result row of the JSON from the repeats of one contender at one size."""
    ok = [m for m in runs if m.trip is not None and m.error is None]
    failure = next((m.error for m in runs if m.error), None)
    seconds = [round(m.trip.seconds, 4) for m in ok]
    median = statistics.median(seconds) if seconds else None

    def peak(role: str) -> float | None:
        values = [m.peaks[role] for m in runs if role in m.peaks]
        return _mib(max(values)) if values else None

    def phase(attr: str) -> float | None:
        values = [getattr(m.trip, attr) for m in ok if getattr(m.trip, attr) is not None]
        return round(statistics.median(values), 4) if values else None

    return {
        "contender": name,
        "size_gb": size_gb,
        "layout": layout,
        "bytes": nbytes,
        "status": "failed" if failure else "ok",
        "reason": failure,
        "seconds": seconds,
        "median_s": median,
        "min_s": min(seconds) if seconds else None,
        "max_s": max(seconds) if seconds else None,
        "s_per_gb": round(median / (nbytes / GB), 4) if median is not None else None,
        "ratio_to_cp": None,
        "pack_s": phase("pack_s"),
        "unpack_s": phase("unpack_s"),
        "producer_peak_private_mib": peak("producer"),
        "consumer_peak_private_mib": peak("consumer"),
        "object_store_peak_mib": _mib(max((m.store_peak for m in runs), default=0)),
        "verified": bool(ok) and not failure,
    }


def skipped(name: str, layout: str, size_gb: float, nbytes: int, reason: str) -> dict[str, Any]:
    """A result row for a contender that was not run, with why."""
    row = summarize(name, layout, size_gb, nbytes, [])
    return {**row, "status": "skipped", "reason": reason, "verified": False}


def _checkpoint_sizes(opts: argparse.Namespace, layout: str) -> list[tuple[float, int]]:
    """``(size_gb as asked, bytes as written)`` for every size of ``layout``."""
    small = opts.small_file_kib * 1024
    if layout == "small" and opts.small_files:
        sizes = [opts.small_files * small / GB]
    else:
        sizes = sorted(opts.sizes)
    out = []
    for size_gb in sizes:
        files, _ = layout_plan(layout, round(size_gb * GB), small)
        out.append((size_gb, sum(n for _, n in files)))
    return out


def run_bench(opts: argparse.Namespace) -> dict[str, Any]:
    """Run every contender at every layout and size; returns the JSON report."""
    contenders = opts.contenders or default_contenders(opts.cross_node)
    config = TransferConfig(chunk_bytes=opts.chunk_mib * MiB, window=opts.window)
    # Absolute: the actors do not share the driver's working directory.
    data_dir = opts.data_dir = os.path.abspath(os.path.expanduser(opts.data_dir))
    os.makedirs(data_dir, exist_ok=True)
    plan = {layout: _checkpoint_sizes(opts, layout) for layout in opts.layout}
    largest = max(n for sizes in plan.values() for _, n in sizes)
    store = opts.object_store_mb * MiB if opts.object_store_mb else None
    store = store or auto_store_bytes(largest, opts.cross_node)
    if opts.prefault:
        progress("prefaulting memory (first touch of a VM's memory is several times slower)")
        prefault_memory(int(opts.memory_margin_gb * GB))

    sources: dict[Any, Any] = {}  # (layout, bytes) -> (path, digest); "warmup" -> path
    for layout, sizes in plan.items():
        for size_gb, nbytes in sizes:
            progress(f"checkpoint {layout} {size_gb:g} GB ({nbytes} bytes) in {data_dir}")
            path = make_checkpoint(
                data_dir, layout, round(size_gb * GB), opts.small_file_kib * 1024
            )
            sources[layout, nbytes] = (path, tree_digest(path))
    if opts.warmup:
        sources["warmup"] = make_checkpoint(data_dir, "big", WARMUP_BYTES, 0)

    machine = machine_info(data_dir)
    results: list[dict[str, Any]] = []
    total = sum(len(s) for s in plan.values()) * len(contenders) * opts.repeats
    steps = (f"[{i}/{total}]" for i in range(1, total + 1))
    with ray_session(opts.cross_node, opts.num_cpus, store) as how:
        store = ray.cluster_resources().get("object_store_memory", store)
        progress(f"{how}: object store {store / GB:.2f} GB in all; {total} measurements")
        if opts.drop_caches and not _drop_caches():
            progress("--drop-caches: /proc/sys/vm/drop_caches is not writable; caches stay")
            opts.drop_caches = False
        for layout, sizes in plan.items():
            results += _run_layout(contenders, layout, sizes, sources, config, opts, steps)
    _add_ratios(results)
    per_node_store = store / (2 if opts.cross_node else 1)
    return {
        "config": {
            **{k: v for k, v in vars(opts).items() if k not in ("run",)},
            "contenders": contenders,
            "data_dir": data_dir,
            "transfer_config": {
                "chunk_bytes": config.chunk_bytes,
                "window": config.window,
                "inline_limit": config.inline_limit,
                "verify": config.verify,
            },
            "object_store_bytes_per_node": int(per_node_store),
            "metrics": {
                "seconds": "driver wall clock around the whole round trip",
                "peak_private": "RssAnon high water from /proc/<pid>/status, 20 ms samples",
                "object_store": "cluster - available object_store_memory over all nodes, "
                "20 ms samples, minus the value at start (raylets report ~every 100 ms)",
                "size_gb": "decimal GB (10**9 bytes)",
            },
        },
        "machine": machine,
        "results": results,
        "linearity": linearity(results),
    }


def _run_layout(
    contenders: list[str],
    layout: str,
    sizes: list[tuple[float, int]],
    sources: dict,
    config: TransferConfig,
    opts: argparse.Namespace,
    progress_step: Iterator[str],
) -> list[dict[str, Any]]:
    """Every contender at every size (ascending) of one layout.

    Repeats are interleaved (rep 1 of every contender, then rep 2, ...) so a drift in
    the machine, such as a disk that slows down under someone else's load, spreads
    over all contenders instead of landing on one. Each contender keeps its own actor
    pair for the layout, so memory one contender leaves in a process is not counted
    against another.
    """
    rows: list[dict[str, Any]] = []
    pairs: dict[str, Ends] = {}
    margin = int(opts.memory_margin_gb * GB)
    try:
        for size_gb, nbytes in sizes:
            src, source = sources[layout, nbytes]
            runs: dict[str, list[Measurement]] = {}
            for name in contenders:
                available = psutil.virtual_memory().available
                reason = skip_reason(name, nbytes, config, available, margin, _store_capacity())
                if reason:
                    steps = [next(progress_step) for _ in range(opts.repeats)]
                    progress(f"{steps[-1]} {name} {layout} {size_gb:g} GB: skipped: {reason}")
                    rows.append(skipped(name, layout, size_gb, nbytes, reason))
                else:
                    runs[name] = []
            for rep in range(1, opts.repeats + 1):
                for name, done in runs.items():
                    if done and done[-1].error:
                        next(progress_step)
                        continue
                    out = os.path.join(opts.data_dir, "out", f"{name}-{layout}-{nbytes}")
                    if name not in pairs:
                        pairs[name] = _start_pair(name, config, sources.get("warmup"), opts)
                    ends = pairs[name]
                    m = measure_once(name, ends, src, out, nbytes, source, opts)
                    done.append(m)
                    step = f"{next(progress_step)} {name} {layout} {size_gb:g} GB"
                    step += f" rep {rep}/{opts.repeats}"
                    if m.error:
                        progress(f"{step}: FAILED: {m.error}")
                        pairs.pop(name).kill()
                    else:
                        s = m.trip.seconds
                        progress(f"{step}: {s:.3f} s, {s / (nbytes / GB):.3f} s/GB, verified")
            rows += [summarize(n, layout, size_gb, nbytes, done) for n, done in runs.items()]
    finally:
        for ends in pairs.values():
            ends.kill()
    order = {name: i for i, name in enumerate(contenders)}
    return sorted(rows, key=lambda r: (r["bytes"], order[r["contender"]]))


def _start_pair(
    name: str, config: TransferConfig, warmup_src: str | None, opts: argparse.Namespace
) -> Ends:
    """A fresh actor pair for ``name``, warmed up by one untimed round trip of a tiny
    checkpoint unless ``--no-warmup``: imports (``ray.train`` alone takes ~0.5 s) and
    first-use setup, such as a strategy's agent actors, are paid once per process,
    not per checkpoint, and would otherwise dominate the first repeat."""
    ends = Ends.start(config, opts.cross_node)
    if warmup_src is not None:
        out = os.path.join(opts.data_dir, "out", f"{name}-warmup")
        try:
            contender_function(name)(ends, warmup_src, out, WARMUP_BYTES)
        except Exception as e:  # the timed runs will fail the same way and say so
            progress(f"warm-up of {name} failed: {_error_reason(e, False, 0)}")
        finally:
            shutil.rmtree(out, ignore_errors=True)
    return ends


def _store_capacity() -> int | None:
    return int(ray.cluster_resources().get("object_store_memory", 0)) or None


def _add_ratios(results: list[dict[str, Any]]) -> None:
    cp = {
        (r["layout"], r["bytes"]): r["median_s"]
        for r in results
        if r["contender"] == "cp" and r["median_s"]
    }
    for r in results:
        base = cp.get((r["layout"], r["bytes"]))
        if base and r["median_s"] is not None:
            r["ratio_to_cp"] = round(r["median_s"] / base, 3)


def linearity(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per layout and contender: s/GB at the largest size over s/GB at the size
    closest to 0.5 GB among the smaller ones. 1.0 is linear; 2.0 means doubling the
    checkpoint took four times as long. None with fewer than two measured sizes."""
    out: dict[str, dict[str, Any]] = {}
    for r in results:
        out.setdefault(r["layout"], {}).setdefault(r["contender"], None)
    for layout, by_name in out.items():
        for name in by_name:
            ok = sorted(
                (r["size_gb"], r["s_per_gb"])
                for r in results
                if r["layout"] == layout and r["contender"] == name and r["status"] == "ok"
            )
            if len(ok) < 2:
                continue
            (big, big_rate), smaller = ok[-1], ok[:-1]
            ref, ref_rate = min(smaller, key=lambda sr: abs(sr[0] - 0.5))
            by_name[name] = {
                "ratio": round(big_rate / ref_rate, 3),
                "largest_size_gb": big,
                "reference_size_gb": ref,
            }
    return out


def machine_info(data_dir: str) -> dict[str, Any]:
    """Where the numbers were measured."""
    mem = psutil.virtual_memory()
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "ray": ray.__version__,
        "air_transfer": air_transfer.__version__,
        "cpus": os.cpu_count(),
        "memory_total_gib": round(mem.total / GiB, 2),
        "memory_available_gib": round(mem.available / GiB, 2),
        "data_dir_free_gib": round(shutil.disk_usage(data_dir).free / GiB, 2),
    }


# -- output ------------------------------------------------------------------------------


def format_table(results: list[dict[str, Any]]) -> str:
    """The results as plain text in aligned columns, then the skip/failure reasons."""
    header = [
        "contender", "layout", "size_gb", "status", "median_s", "min_s", "max_s",
        "s/GB", "x_cp", "prod_MiB", "cons_MiB", "store_MiB", "verified",
    ]  # fmt: skip

    def num(value: float | None, digits: int = 3) -> str:
        return "-" if value is None else f"{value:.{digits}f}"

    rows = [
        [
            r["contender"], r["layout"], f"{r['size_gb']:g}", r["status"],
            num(r["median_s"]), num(r["min_s"]), num(r["max_s"]), num(r["s_per_gb"]),
            num(r["ratio_to_cp"], 2), num(r["producer_peak_private_mib"], 0),
            num(r["consumer_peak_private_mib"], 0), num(r["object_store_peak_mib"], 0),
            "yes" if r["verified"] else "no",
        ]
        for r in results
    ]  # fmt: skip
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    left = {0, 1, 3}

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i in left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    lines = [line(header), line(["-" * w for w in widths]), *map(line, rows)]
    notes = [
        f"  {r['contender']} {r['layout']} {r['size_gb']:g} GB {r['status']}: {r['reason']}"
        for r in results
        if r["reason"]
    ]
    return "\n".join(lines + (["", "not run or failed:", *notes] if notes else []))


def format_linearity(lin: dict[str, dict[str, Any]]) -> str:
    """One line per layout and contender, or a note why it is missing."""
    lines = ["linearity (s/GB at the largest size / s/GB at the reference size; 1.00 = linear):"]
    for layout, by_name in lin.items():
        for name, value in by_name.items():
            if value is None:
                text = "n/a (fewer than two measured sizes)"
            else:
                text = (
                    f"{value['ratio']:.2f}  ({value['largest_size_gb']:g} GB vs "
                    f"{value['reference_size_gb']:g} GB)"
                )
            lines.append(f"  {name:<10} {layout:<6} {text}")
    return "\n".join(lines)


def _pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend, imported only when a plot is asked for."""
    try:
        import matplotlib
    except ImportError as e:
        raise ImportError(
            "--plot needs matplotlib, an optional dependency: pip install 'air-transfer[bench]'"
        ) from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plot(results: list[dict[str, Any]], path: str) -> None:
    """Left: s/GB against size per contender (log x; flat = linear). Right: peak
    private memory against size, consumer solid and producer dashed."""
    plt = _pyplot()
    fig, (speed, memory) = plt.subplots(1, 2, figsize=(13, 5))
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in results:
        if r["status"] == "ok":
            series.setdefault((r["contender"], r["layout"]), []).append(r)
    multi_layout = len({layout for _, layout in series}) > 1
    for index, ((name, layout), rows) in enumerate(series.items()):
        rows.sort(key=lambda r: r["size_gb"])
        label = f"{name} ({layout})" if multi_layout else name
        color = f"C{index % 10}"
        x = [r["size_gb"] for r in rows]
        speed.plot(x, [r["s_per_gb"] for r in rows], "o-", color=color, label=label)
        for role, style in (("consumer", "o-"), ("producer", "x--")):
            y = [r[f"{role}_peak_private_mib"] for r in rows]
            if any(v is not None for v in y):
                memory.plot(x, [math.nan if v is None else v for v in y], style, color=color)
        memory.plot([], [], "o-", color=color, label=label)
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    sizes = sorted({r["size_gb"] for rows in series.values() for r in rows})
    for ax in (speed, memory):
        ax.set_xscale("log")
        # Ticks at the measured sizes, labelled plainly ("0.5", not "5 x 10^-1").
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel("checkpoint size (GB)")
        ax.grid(True, which="both", alpha=0.3)
    speed.set_yscale("log")
    speed.set_ylabel("seconds per GB (flat = linear, lower = faster)")
    speed.set_title("round-trip time per GB")
    memory.set_ylabel("peak private memory, MiB (RssAnon)")
    memory.set_title("consumer (solid) and producer (dashed) peak private memory")
    speed.legend(fontsize="small")
    memory.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- command line ------------------------------------------------------------------------


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def default_data_dir() -> str:
    """``$XDG_CACHE_HOME/air-transfer-bench``, else ``~/.cache/air-transfer-bench``."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "air-transfer-bench")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's flags."""
    defaults = TransferConfig()
    parser.add_argument(
        "--sizes", nargs="+", type=_positive_float, default=[0.5, 1, 2, 4], metavar="GB",
        help="checkpoint sizes in decimal GB (10**9 bytes), e.g. 0.5 1 2 4 (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--layout", nargs="+", choices=LAYOUTS, default=["big"],
        help="how the bytes are laid out: 'big' one file, 'small' many files of "
        "--small-file-kib, 'mixed' half one file, 8 shards, small files, an empty file "
        "and directory; several may be given (default: big)",
    )  # fmt: skip
    parser.add_argument(
        "--small-file-kib", type=_positive_int, default=8, metavar="KiB",
        help="size of each file in the small and mixed layouts (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--small-files", type=_positive_int, default=None, metavar="N",
        help="for --layout small, exactly N files (e.g. 20000) instead of deriving the "
        "count from --sizes",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=_positive_int, default=3,
        help="round trips per contender and size; median, min and max are reported "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--contenders", nargs="+", choices=all_contenders(), default=None, metavar="NAME",
        help=f"which contenders to run, of: {', '.join(all_contenders())} (default: all; "
        "'raw' only with --cross-node)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-mib", type=_positive_int, default=defaults.chunk_bytes // MiB, metavar="MiB",
        help="air-transfer chunk size, also raw's chunk size (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=_positive_int, default=defaults.window,
        help="air-transfer prefetch window in chunks, also raw's (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--cross-node", action="store_true",
        help="start a 2-node ray.cluster_utils.Cluster on this machine and run the "
        "producer on one node and the consumer on the other; adds 'raw'. 'cp' stays a "
        "local copy, the floor",
    )  # fmt: skip
    parser.add_argument(
        "--data-dir", default=default_data_dir(), metavar="DIR",
        help="where checkpoints are cached between runs (keyed by layout and size) and "
        "outputs written (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--clean", action="store_true",
        help="delete the cached checkpoints and outputs in --data-dir when done",
    )  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument(
        "--plot", metavar="PATH.png",
        help="write a PNG: s/GB and peak private memory against size (needs matplotlib)",
    )  # fmt: skip
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false",
        help="skip the untimed 1 MiB round trip each fresh producer/consumer pair makes "
        "first, and so measure first-use costs (imports, agent start) in repeat 1",
    )  # fmt: skip
    parser.add_argument(
        "--drop-caches", action="store_true",
        help="drop the page cache before every round trip (root only; default: warm cache)",
    )  # fmt: skip
    parser.add_argument(
        "--num-cpus", type=_positive_int, default=max(2, os.cpu_count() or 2),
        help="CPUs Ray advertises per node (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--object-store-mb", type=_positive_int, default=None, metavar="MiB",
        help="object store per node; shrink it (e.g. 512) to see 'chunked' spill and "
        "'streamed' stay within its window (default: 1.5x the largest checkpoint + "
        "256 MiB, at most 30%% of memory, 20%% per node with --cross-node)",
    )  # fmt: skip
    parser.add_argument(
        "--no-prefault", dest="prefault", action="store_false",
        help="skip touching all free memory once before measuring. On a VM the first "
        "touch of a page costs several times a later one (measured here: 19 GiB in "
        "11.9 s, then 2.8 s), which would land on whichever contender first reaches a "
        "new memory high-water mark",
    )  # fmt: skip
    parser.add_argument(
        "--memory-margin-gb", type=_positive_float, default=2.0, metavar="GB",
        help="skip a contender whose predicted memory exceeds available memory minus "
        "this; a run is killed if available memory falls under half of it "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.set_defaults(run=main)


def main(opts: argparse.Namespace) -> int:
    """Run the bench from parsed ``opts``: table and linearity on stdout, progress on
    stderr, JSON and PNG where asked."""
    if opts.small_files and "small" not in opts.layout:
        progress("--small-files applies only to --layout small")
        return 2
    if opts.plot:
        try:
            _pyplot()  # fail now, not after an hour of measuring
        except ImportError as e:
            progress(str(e))
            return 2
    report = run_bench(opts)
    print(format_table(report["results"]))
    print()
    print(format_linearity(report["linearity"]))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(report, f, indent=2, default=str)
        progress(f"wrote {opts.json}")
    if opts.plot:
        write_plot(report["results"], opts.plot)
        progress(f"wrote {opts.plot}")
    if opts.clean:
        removed = clean_data_dir(os.path.abspath(os.path.expanduser(opts.data_dir)))
        progress(f"--clean: removed {len(removed)} cached entries from {opts.data_dir}")
    failed = [r for r in report["results"] if r["status"] == "failed"]
    return 1 if failed else 0
