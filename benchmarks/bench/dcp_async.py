"""``bench --dcp``'s async save: in the ``air-transfer`` run, after its synchronous
save and restore, every rank stages the state dict to CPU the way ``dcp.async_save``
does (DCP's ``BlockingAsyncStager``, which torch's ``FileSystemWriter``, and so
``NodeStorageWriter``, is: a fresh CPU copy of every tensor), timed, then reports it
with ``air_transfer.dcp.report(..., checkpoint_upload_mode=ASYNC)``, timed until the
call returns (its blocking part), and waits for the save to complete; ``ROUNDS``
times, the two in turn (a single staging of a few hundred MiB takes tens of
milliseconds and swings by as much as the difference measured), then restores the
last save (verified). Each figure is the rank's median over the rounds, the rounds
kept beside it (``*_rounds_s``). ``async_to_staging``: the blocking part over the
staging, per rank; the bar is 1.1 (the call blocks only while it stages).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import ray
import ray.train

StateDict = dict[str, Any]
#: Rounds of staging and async save, each figure their median.
ROUNDS = 3


def async_save(
    state: StateDict,
    out: dict[str, Any],
    equal: Callable[[StateDict, StateDict], bool],
    zeroed: Callable[[StateDict], StateDict],
) -> None:
    """In a Train worker: stage, then save ``state`` asynchronously; the figures into
    ``out``. Every rank calls it at once."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.staging import BlockingAsyncStager

    import air_transfer.dcp

    rounds: dict[str, list[float]] = {"staging_s": [], "async_save_s": [], "async_done_s": []}
    for step in range(2, 2 + ROUNDS):
        dist.barrier()
        start = time.perf_counter()
        staged = BlockingAsyncStager().stage(state)
        rounds["staging_s"].append(time.perf_counter() - start)
        del staged
        dist.barrier()
        start = time.perf_counter()
        air_transfer.dcp.report(
            {"step": step},
            state_dict=state,
            checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC,
        )
        rounds["async_save_s"].append(time.perf_counter() - start)
        air_transfer.dcp.wait_for_pending_save()
        rounds["async_done_s"].append(time.perf_counter() - start)
    for key, values in rounds.items():
        out[key] = statistics.median(values)
        out[key.removesuffix("_s") + "_rounds_s"] = values
    reported = ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
    )
    out["async_reported"] = len(reported)
    restored = zeroed(state)
    assert air_transfer.dcp.load(restored, reported[-1].checkpoint)
    out["verified"] = out.get("verified", True) and equal(restored, state)


def add_async_save(row: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """The async figures of a row, from its ranks' records."""
    row["staging_s"] = [r["staging_s"] for r in ranks]
    row["async_save_s"] = [r["async_save_s"] for r in ranks]
    row["async_to_staging"] = [r["async_save_s"] / r["staging_s"] for r in ranks]
    row["async_done_s"] = max(r["async_done_s"] for r in ranks)
    for key in ("staging_rounds_s", "async_save_rounds_s", "async_done_rounds_s"):
        row[key] = [r[key] for r in ranks]
    row["async_reported"] = min(r["async_reported"] for r in ranks)


def format_async_save(rows: list[dict[str, Any]]) -> str:
    """One line per row with an async save: its blocking part beside the staging."""
    lines = []
    for r in rows:
        if r["status"] != "ok" or "async_save_s" not in r:
            continue

        def pair(key: str, r: dict[str, Any] = r) -> str:
            return "/".join(f"{v:.2f}" for v in r[key])

        lines.append(
            f"{r['contender']}: async save blocking r0/r1 {pair('async_save_s')} s, "
            f"staging to CPU {pair('staging_s')} s ({pair('async_to_staging')}x); "
            f"complete after {r['async_done_s']:.2f} s (medians of {ROUNDS} rounds)"
        )
    return "\n".join(lines)
