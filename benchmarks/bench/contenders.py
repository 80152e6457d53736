"""The contenders: their names, and one function each that makes one timed round trip
through an actor pair (``Ends``)."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray

from air_transfer.extend import strategies as registered_strategies
from benchmarks.bench import tune
from benchmarks.bench.endpoint import Ends

BUILTIN_CONTENDERS = ("cp", "cp-direct", "blob", "tune")
RAW = "raw"
#: ``chunked`` through ``to_object_ref_async``: the producer blocks only for the call.
ASYNC = "chunked-async"
#: Contenders that copy within the consumer's node and have no producer process.
LOCAL_COPIES = ("cp", "cp-direct")


def all_contenders() -> list[str]:
    """Every contender name: the built-ins, each registered strategy, ``chunked``
    through the non-blocking call, and ``raw``."""
    return [*BUILTIN_CONTENDERS, *registered_strategies, ASYNC, RAW]


def default_contenders(cross_node: bool) -> list[str]:
    """What runs without ``--contenders``: all of them, ``raw`` only across nodes,
    where it is the ceiling the others are judged against."""
    return [c for c in all_contenders() if c != RAW or cross_node]


def packs_in_agent(name: str) -> bool:
    """Whether contender ``name`` has its node's agent pack the chunks (so the
    agent's memory is sampled with the producer's): every air-transfer one."""
    return name in registered_strategies or name == ASYNC


@dataclass
class Trip:
    """One timed round trip. ``call_s`` is how long the producer's call blocked
    (``to_object_ref``, or ``to_object_ref_async``); ``pack_s`` is until the source
    was free again. ``verified`` is set by contenders without output files;
    ``hold`` keeps the trip's objects referenced until the sampler has seen them."""

    seconds: float
    pack_s: float | None = None
    unpack_s: float | None = None
    verified: bool | None = None
    hold: Any = None
    call_s: float | None = None


def run_cp(ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """The floor: a local ``shutil.copytree`` in the consumer (also across nodes,
    where no Ray transfer can beat the local disk)."""
    start = time.perf_counter()
    unpack_s = ray.get(ends.consumer.copytree.remote(src, out))
    return Trip(time.perf_counter() - start, None, unpack_s)


def run_cp_direct(ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """The disk floor: the same local copy as ``cp``, but with large files written
    around the page cache as air-transfer writes them (``TransferConfig.direct_io``),
    so the bytes reach the disk on the clock. No round trip that lands its output on
    disk can beat it; ``cp`` itself only fills the page cache."""
    start = time.perf_counter()
    unpack_s = ray.get(ends.consumer.copytree.remote(src, out, direct_io=True))
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
    with ``force_all=True``: Tune's pack actor on the source node tars the directory
    in its constructor, the target side pulls 500 MiB chunks and untars (Tune's own
    code, through ``benchmarks.bench.tune``; its size limit lifted so that larger sizes
    can be measured at all).
    """
    start = time.perf_counter()
    pack_actor = tune.tune_pack_actor(src, ends.producer_node)
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
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = tune.actor_pid(handle)
        if pid:
            return pid
        time.sleep(0.01)
    return None


def run_strategy(name: str, ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """An air-transfer strategy through the public API: ``to_object_ref`` in the
    producer, ``from_object_ref(...).to_directory`` in the consumer."""
    config = ends.config.replace(strategy=name)
    start = time.perf_counter()
    packed = ends.producer.air_pack.remote(src, config)
    pack_s, unpack_s = ray.get(ends.consumer.air_unpack.remote(packed, out))
    # The sync call blocks until every chunk is packed: its call time is pack_s.
    return Trip(time.perf_counter() - start, pack_s, unpack_s, hold=packed, call_s=pack_s)


def run_async(ends: Ends, src: str, out: str, nbytes: int) -> Trip:
    """``chunked`` through ``to_object_ref_async`` in the producer: the consumer gets
    the ref as soon as the call returns and writes chunk i while later ones are
    still being packed by the node's agent. The round trip runs from the call to the
    target published; ``call_s`` is what the call blocked the producer, ``pack_s``
    when its future completed (the source free again)."""
    config = ends.config.replace(strategy="chunked")
    start = time.perf_counter()
    packed = ends.producer.air_pack_async.remote(src, config)
    call_s, unpack_s = ray.get(ends.consumer.air_unpack.remote(packed, out))
    seconds = time.perf_counter() - start
    pack_s = ray.get(ends.producer.air_async_packed.remote())
    return Trip(seconds, pack_s, unpack_s, hold=packed, call_s=call_s)


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
    builtins = {
        "cp": run_cp,
        "cp-direct": run_cp_direct,
        "blob": run_blob,
        "tune": run_tune,
        RAW: run_raw,
        ASYNC: run_async,
    }
    if name in builtins:
        return builtins[name]
    if name in registered_strategies:
        return functools.partial(run_strategy, name)
    raise ValueError(f"unknown contender {name!r}; known: {', '.join(all_contenders())}")
