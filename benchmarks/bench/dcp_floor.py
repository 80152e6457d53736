"""``bench --dcp``'s floor: the ``raw-ray-floor`` row, each rank's bytes moved to the
storage node with plain Ray and written there, and read back the same way: what a
save and a restore through node storage cost with nothing but the bytes.

It runs inside ``ray-recipe``'s Train run, after that contender's own save and
restore (no Train run of its own), from the same ranks on the same nodes with the
same state. Save, per rank: ``ray.put`` of the state's tensors' bytes (a list of
zero-copy numpy views, one copy into the rank node's object store), then a call to
``StorageEnd``, an actor pinned on the storage node, which Ray hands the object
pulled into that node's store and which writes it into one file of the run's
storage directory (buffered, no fsync: node storage syncs nothing either; it
writes large files with ``O_DIRECT``, this floor through the page cache). Restore:
the file mapped on the storage node and returned (one copy into its object store),
pulled to the rank's node, its bytes copied into a zeroed state dict. Both ranks at
once; non-tensor values (``step``) are not part of the bytes moved.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray
import ray.train

CONTENDER = "raw-ray-floor"
StateDict = dict[str, Any]


class StorageEnd:
    """On the storage node (``max_concurrency``: one thread per rank): writes each
    rank's bytes into a file of ``directory`` and reads it back."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def ready(self) -> bool:
        return True

    def write(self, name: str, arrays: list[np.ndarray]) -> int:
        """Write ``arrays`` one after the other into file ``name``; its size."""
        path = os.path.join(self.directory, name)
        with open(path, "wb", buffering=0) as f:
            for a in arrays:
                view = memoryview(a).cast("B")
                while view:
                    view = view[f.write(view) :]
        return os.path.getsize(path)

    def read(self, name: str) -> np.ndarray:
        """File ``name``'s bytes: mapped, so that Ray copies them from the page cache
        into the object store once (a plain ndarray view: Ray pickles a memmap whole)."""
        mapped = np.memmap(os.path.join(self.directory, name), dtype=np.uint8, mode="r")
        return mapped.view(np.ndarray)


def start_storage_end(storage_node: str, directory: str, ranks: int) -> Any:
    """A ``StorageEnd`` on ``storage_node``, started (its worker up) before anything
    is timed."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    end: Any = (
        ray.remote(StorageEnd)
        .options(
            num_cpus=0,
            max_concurrency=ranks,
            scheduling_strategy=NodeAffinitySchedulingStrategy(storage_node, soft=False),
        )
        .remote(directory)
    )
    ray.get(end.ready.remote())
    return end


def floor_trip(
    state: StateDict,
    end: Any,
    out: dict[str, Any],
    equal: Callable[[StateDict, StateDict], bool],
    zeroed: Callable[[StateDict], StateDict],
) -> None:
    """In a Train worker: this rank's floor save and restore, into ``out`` (keys
    ``floor_*``). Every rank calls it at once."""
    import torch
    import torch.distributed as dist

    name = f"rank{ray.train.get_context().get_world_rank()}.bin"
    dist.barrier()
    start = time.perf_counter()
    arrays = [
        v.detach().reshape(-1).view(torch.uint8).numpy()
        for v in state.values()
        if isinstance(v, torch.Tensor)
    ]
    ref = ray.put(arrays)
    out["floor_bytes"] = ray.get(end.write.remote(name, ref))
    out["floor_save_s"] = time.perf_counter() - start
    dist.barrier()
    out["floor_save_wall_s"] = time.perf_counter() - start
    del ref, arrays
    dist.barrier()
    start = time.perf_counter()
    restored = zeroed(state)
    data = ray.get(end.read.remote(name))
    offset = 0
    for k, v in restored.items():
        if isinstance(v, torch.Tensor):
            n = v.nbytes
            np.copyto(v.reshape(-1).view(torch.uint8).numpy(), data[offset : offset + n])
            offset += n
        else:
            restored[k] = state[k]  # not among the bytes moved
    out["floor_restore_s"] = time.perf_counter() - start
    dist.barrier()
    out["floor_restore_wall_s"] = time.perf_counter() - start
    out["floor_verified"] = offset == len(data) and equal(restored, state)


def floor_row(recipe: dict[str, Any]) -> dict[str, Any]:
    """The ``raw-ray-floor`` row from ``ray-recipe``'s row, whose ranks measured it."""
    row: dict[str, Any] = {"contender": CONTENDER, "status": recipe["status"]}
    row["reason"] = recipe["reason"]
    if recipe["status"] != "ok" and "ranks" not in recipe:
        return row
    ranks = recipe["ranks"]
    row["verified"] = all(r["floor_verified"] for r in ranks)
    row["save_s"] = [r["floor_save_s"] for r in ranks]
    row["restore_s"] = [r["floor_restore_s"] for r in ranks]
    row["restore_bytes"] = [r["floor_bytes"] for r in ranks]
    row["local_temp_bytes"] = [0 for _ in ranks]
    row["state_bytes"] = [r["state_bytes"] for r in ranks]
    row["save_wall_s"] = max(r["floor_save_wall_s"] for r in ranks)
    row["restore_wall_s"] = max(r["floor_restore_wall_s"] for r in ranks)
    row["load_anon_bytes"] = None
    row["status"], row["reason"] = "ok", None
    if not row["verified"]:
        row["status"], row["reason"] = "failed", "a restore differs from what was saved"
    return row
