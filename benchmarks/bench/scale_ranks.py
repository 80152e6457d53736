"""The ranks of ``bench --scale``: the Train loop each rank runs (one shard per report
round), the gate that holds every rank between rounds while the driver reads Ray's
byte counters, and the restore of one rank's shard on its node."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import tempfile
import time
from typing import Any

import pyarrow.fs as pafs
import ray
import ray.train

from benchmarks.bench.data import tree_digest
from benchmarks.units import MiB


def shard_name(rank: int) -> str:
    """The file rank ``rank`` stores in each round's checkpoint."""
    return f"shard-{rank}.bin"


class RoundGate:
    """Holds the ranks at the start of each round until the driver has read the
    counters (``arrive`` returns once ``open`` is called for that round), and keeps
    what the ranks say: their nodes, each round's report start and end
    (``time.time()``: the ranks share this machine's clock), the digest of the
    shard each stored last and the sha256 of every shard each stored (what finds a
    rank's shard on a node's disk whatever name it is kept under). Round ``rounds``
    is the gate after the last one."""

    def __init__(self, ranks: int) -> None:
        self.ranks = ranks
        self.arrived: dict[int, set[int]] = {}
        self.all_here: dict[int, asyncio.Event] = {}
        self.opened: dict[int, asyncio.Event] = {}
        self.nodes: dict[int, str] = {}
        self.times: dict[int, dict[int, tuple[float, float]]] = {}
        self.digests: dict[int, Any] = {}
        self.shards: dict[int, set[str]] = {}

    def _event(self, events: dict[int, asyncio.Event], round_: int) -> asyncio.Event:
        return events.setdefault(round_, asyncio.Event())

    async def arrive(self, rank: int, round_: int, node: str) -> None:
        self.nodes[rank] = node
        self.arrived.setdefault(round_, set()).add(rank)
        if len(self.arrived[round_]) == self.ranks:
            self._event(self.all_here, round_).set()
        await self._event(self.opened, round_).wait()

    async def wait_all_arrived(self, round_: int) -> None:
        await self._event(self.all_here, round_).wait()

    def open(self, round_: int) -> None:
        self._event(self.opened, round_).set()

    def done(
        self, rank: int, round_: int, start: float, end: float, digest: Any, shard_sha: str
    ) -> None:
        self.times.setdefault(round_, {})[rank] = (start, end)
        self.digests[rank] = digest
        self.shards.setdefault(rank, set()).add(shard_sha)

    def record(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "times": self.times, "digests": self.digests,
            "shards": self.shards,
        }  # fmt: skip


def new_gate(ranks: int) -> Any:
    """A ``RoundGate`` actor (no CPU: it only waits)."""
    return ray.remote(num_cpus=0)(RoundGate).remote(ranks)


def rank_loop(config: dict[str, Any]) -> None:
    """One rank: ``config["rounds"]`` report rounds, each a fresh checkpoint directory
    holding this rank's shard of ``config["shard_bytes"]`` random bytes, reported
    (``SYNC``) once the gate opens the round; its start, end and digest to the gate."""
    gate, rounds, size = config["gate"], config["rounds"], config["shard_bytes"]
    rank = ray.train.get_context().get_world_rank()
    node = ray.get_runtime_context().get_node_id()
    for round_ in range(rounds):
        d = tempfile.mkdtemp(prefix=f"scale-{round_}-{rank}-")
        shard_sha = _random_file(os.path.join(d, shard_name(rank)), size)
        digest = tree_digest(d)
        os.sync()  # the shard's writes are not flushed on the round's clock
        ray.get(gate.arrive.remote(rank, round_, node))
        start = time.time()
        ray.train.report(
            {"round": round_, "rank": rank},
            checkpoint=ray.train.Checkpoint.from_directory(d),
            delete_local_checkpoint_after_upload=False,
        )
        end = time.time()
        shutil.rmtree(d, ignore_errors=True)
        ray.get(gate.done.remote(rank, round_, start, end, digest, shard_sha))
    ray.get(gate.arrive.remote(rank, rounds, node))


def _random_file(path: str, size: int) -> str:
    """``size`` random bytes written to ``path``; their sha256 (hex)."""
    sha = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 16 * MiB))
            f.write(block)
            sha.update(block)
            left -= len(block)
    return sha.hexdigest()


def restore_shard(checkpoint: ray.train.Checkpoint, rank: int, out: str) -> tuple[float, Any]:
    """Rank ``rank``'s shard of ``checkpoint`` copied to ``out`` on this node through
    the checkpoint's filesystem (what a rank restoring its own shard reads): the
    seconds it took and the digest of the copy, which is then deleted."""
    os.makedirs(out, exist_ok=True)
    name = shard_name(rank)
    start = time.perf_counter()
    pafs.copy_files(
        f"{checkpoint.path}/{name}",
        os.path.join(out, name),
        source_filesystem=checkpoint.filesystem,
        destination_filesystem=pafs.LocalFileSystem(),
    )
    seconds = time.perf_counter() - start
    try:
        return seconds, tree_digest(out)
    finally:
        shutil.rmtree(out, ignore_errors=True)


def restore_on(node: str) -> Any:
    """``restore_shard`` as a task pinned to ``node`` (a Ray node id)."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    return ray.remote(restore_shard).options(num_cpus=0, scheduling_strategy=strategy)
