"""``bench --dcp``'s incremental row: the ``air-incremental`` contender saves a second
time with ~90% of each rank's bytes unchanged (the last tensors of the state dict,
its top layers with their Adam state, making up ``CHANGED`` of its bytes get new
values, same shapes: frozen layers below trained ones; DCP lays a shard out in the
state dict's order, so they are contiguous in it) into incremental node storage
(``TransferConfig(incremental=True)``); figures: what the storage agent's
``incremental_counters`` say that save sent and reused (both ranks), its blocking
time per rank beside the first save's, and whether it restores exactly.
"""

from __future__ import annotations

from typing import Any

import ray

CONTENDER = "air-incremental"
#: The fraction of each rank's state bytes the second save changes.
CHANGED = 0.10


def changed_state(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its last tensors holding ``CHANGED`` of its tensor bytes
    replaced by other values of the same shape, and the step advanced."""
    import torch

    tensors = [k for k, v in reversed(state.items()) if isinstance(v, torch.Tensor)]
    budget = CHANGED * sum(state[k].nbytes for k in tensors)
    out, spent = dict(state), 0
    for k in tensors:
        if spent + state[k].nbytes > budget:
            break
        out[k] = state[k] + 1.0
        spent += state[k].nbytes
    out["step"] = int(state["step"]) + 1
    return out


def second_save(
    state: dict[str, Any], config: dict[str, Any], out: dict[str, Any], equal: Any, zeroed: Any
) -> None:
    """Report ``changed_state(state)`` from every rank; its cost into ``out``."""
    import time

    import torch.distributed as dist

    import air_transfer.dcp

    rank = ray.train.get_context().get_world_rank()
    agent = air_transfer.node_agent(config["storage_node"])
    changed = changed_state(state)
    dist.barrier()
    before = ray.get(agent.incremental_counters.remote())
    dist.barrier()
    start = time.perf_counter()
    air_transfer.dcp.report({"step": changed["step"]}, state_dict=changed)
    out["second_save_s"] = time.perf_counter() - start
    dist.barrier()
    after = ray.get(agent.incremental_counters.remote())
    if rank == 0:
        out["second_bytes_sent"] = after["bytes_sent"] - before["bytes_sent"]
        out["second_bytes_reused"] = after["bytes_reused"] - before["bytes_reused"]
    checkpoint = ray.train.get_all_reported_checkpoints(
        consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
    )[-1].checkpoint
    restored = zeroed(changed)
    assert air_transfer.dcp.load(restored, checkpoint)
    out["verified"] = out.get("verified", True) and equal(restored, changed)


def add_second_save(row: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """The incremental figures of a row, from its ranks' records."""
    sent, reused = ranks[0]["second_bytes_sent"], ranks[0]["second_bytes_reused"]
    row["second_save_s"] = [r["second_save_s"] for r in ranks]
    row["second_bytes_sent"], row["second_bytes_reused"] = sent, reused
    row["second_sent_fraction"] = sent / (sent + reused) if sent + reused else None


def format_second_save(rows: list[dict[str, Any]]) -> str:
    """One line per incremental row: the second save's bytes sent and time."""
    lines = []
    for r in rows:
        if r["status"] != "ok" or "second_bytes_sent" not in r:
            continue
        first = "/".join(f"{v:.2f}" for v in r["save_s"])
        second = "/".join(f"{v:.2f}" for v in r["second_save_s"])
        lines.append(
            f"{r['contender']}: second save, {1 - CHANGED:.0%} unchanged: sent "
            f"{r['second_bytes_sent'] / 2**20:.1f} MiB of "
            f"{(r['second_bytes_sent'] + r['second_bytes_reused']) / 2**20:.1f} "
            f"({r['second_sent_fraction']:.1%}); save_s r0/r1 {second} (first {first})"
        )
    return "\n".join(lines)
