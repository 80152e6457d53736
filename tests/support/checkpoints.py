"""Checkpoint directories and remote producers/consumers pinned to nodes."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import ray

from air_transfer import ChunkedCheckpoint, TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.extend import Packed, PackRequest, TransferStrategy
from tests.support.waiting import eventually

MiB = 1024 * 1024


def make_checkpoint(root: Path, total_bytes: int, seed: int = 0) -> Path:
    """A model-like checkpoint: one big file, a few small ones, nested dirs."""
    (root / "optim").mkdir(parents=True, exist_ok=True)
    (root / "tokenizer").mkdir(exist_ok=True)
    (root / "tokenizer" / "vocab ü.json").write_bytes(b'{"a": %d}' % seed)
    (root / "optim" / "state.pt").write_bytes(os.urandom(300_000))
    (root / "empty").write_bytes(b"")
    remaining = total_bytes
    with open(root / "model.bin", "wb") as f:
        while remaining > 0:
            block = os.urandom(min(remaining, 16 * MiB))
            f.write(block)
            remaining -= len(block)
    return root


def digest_tree(root: str | Path) -> dict[str, str]:
    """relative path -> sha256 of every file, streamed (no whole file in memory)."""
    out = {}
    root = Path(root)
    for path in sorted(root.rglob("*")):
        if path.is_file() and not path.is_symlink():
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while block := f.read(4 * MiB):
                    h.update(block)
            out[path.relative_to(root).as_posix()] = h.hexdigest()
    return out


def on(node: str) -> dict[str, Any]:
    """Remote options pinning a task or actor to the node with resource ``node``."""
    return {"num_cpus": 0, "resources": {node: 0.01}}


@ray.remote
class Producer:
    """A training worker: packs checkpoints, and can die."""

    def node_id(self) -> str:
        return ray.get_runtime_context().get_node_id()

    def pid(self) -> int:
        return os.getpid()

    def share(self, path: str, config: TransferConfig) -> list[ray.ObjectRef]:
        return [ChunkedCheckpoint.from_directory(path).to_object_ref(config=config)]

    def share_restored(self, path: str, config: TransferConfig) -> list[ChunkedCheckpoint]:
        ref = ChunkedCheckpoint.from_directory(path).to_object_ref(config=config)
        return [ChunkedCheckpoint.from_object_ref(ref)]


@ray.remote
def consume_ref(refs: list[ray.ObjectRef], target: str) -> tuple[str, dict[str, str]]:
    out = ChunkedCheckpoint.from_object_ref(refs[0]).to_directory(target)
    return ray.get_runtime_context().get_node_id(), digest_tree(out)


@ray.remote
def consume_checkpoint(ckpt: ChunkedCheckpoint, target: str) -> tuple[str, dict[str, str]]:
    out = ckpt.to_directory(target)
    return ray.get_runtime_context().get_node_id(), digest_tree(out)


@ray.remote
class Consumer:
    """An evaluator that can be killed mid-write."""

    def pid(self) -> int:
        return os.getpid()

    def write(self, ckpt: ChunkedCheckpoint, target: str) -> dict[str, str]:
        return digest_tree(ckpt.to_directory(target))


def kill_and_wait(actor: Any, pid: int | None = None) -> None:
    """Kill an actor and return once its process is gone (ray.kill is asynchronous).
    Pass ``pid`` (asked beforehand) for an actor that is busy in a call."""
    if pid is None:
        pid = ray.get(actor.pid.remote())
    ray.kill(actor)
    eventually(lambda: not psutil.pid_exists(pid), f"actor process {pid} to exit")


class PutWherePacked(TransferStrategy):
    """A user's strategy, registered only in the process that transfers (never at
    import: the agent imports this module to unpickle it): one ``ray.put`` per
    chunk by whoever packs, with ``owner="node"`` the agent."""

    name = "test-put-where-packed"

    def pack(self, request: PackRequest) -> Packed:
        refs, checksums = [], []
        for _index, view, checksum in request.chunks():
            refs.append(ray.put(np.frombuffer(view, dtype=np.uint8)))
            checksums.append(checksum)
        return Packed(refs, tuple(checksums))

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: Any
    ) -> Iterator[Any]:
        for ref in payload[start:stop]:
            yield ray.get(ref)


def put_in_agent(agent: Any) -> list[ray.ObjectRef]:
    """Run in a node agent (``__ray_call__``): an object it owns and does not keep,
    nested so that the caller borrows it."""
    return [ray.put(np.zeros(64 * 1024, dtype=np.uint8))]


@ray.remote(num_cpus=0)
class Holder:
    """An evaluator that keeps what a worker handed it."""

    def __init__(self) -> None:
        self.held: tuple[list[Any], list[Any], int] | None = None

    def keep(self, refs: list[Any], canary: list[Any], giver_pid: int) -> None:
        self.held = (refs, canary, giver_pid)

    def giver(self) -> int | None:
        return None if self.held is None else self.held[2]

    def refs(self) -> list[Any]:
        assert self.held is not None
        return self.held[0]

    def canary_alive(self) -> bool:
        """Whether the canary it was handed can still be fetched."""
        assert self.held is not None
        try:
            ray.get(self.held[1][0], timeout=10)
        except (ray.exceptions.ObjectLostError, ray.exceptions.GetTimeoutError):
            return False
        return True


@ray.remote(num_cpus=0, max_retries=0)
def hand_over_then_hang(path: str, config: TransferConfig, holder: Any, register: bool) -> None:
    """A training worker: transfers ``path`` with ``config``, hands the ref to
    ``holder`` with a canary (an object its node's agent owns, borrowed the same way,
    which Ray frees once the agent has counted this worker's refs as gone), and waits
    to be killed. ``register``: register ``PutWherePacked`` here first, selected for
    any size."""
    from air_transfer.cluster.nodes import node_agent
    from air_transfer.extend import register_strategy

    if register:
        register_strategy(PutWherePacked, select_above_bytes=0)
    ref = ChunkedCheckpoint.from_directory(path).to_object_ref(config=config)
    canary = ray.get(node_agent().__ray_call__.remote(put_in_agent))
    ray.get(holder.keep.remote([ref], canary, os.getpid()))
    threading.Event().wait()
