"""``bench --dcp``'s CPU seconds per process of a save and of a restore: where each
CPU second of a phase goes (each rank, the storage node's agent, the raylets, the
rest of the session), the figure that says what more cores would do on a machine
whose two cores the phase already fills.

Rank 0 snapshots every process of the session (``bench.cpu``, from the driver's
process tree: the mock cluster runs on one machine) between two barriers at each
phase's edge: every rank has finished the phase before and none has started the
next, so a phase's figure is everything the session spent from its start to its end.
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.bench import cpu

#: The phases measured, in the order of ``dcp_loop``; a row's ``<phase>_cpu_s``.
PHASES = ("save", "restore")
STORAGE_AGENT = "storage agent"


class PhaseCpu:
    """``mark()`` at each phase's edge, on every rank (it holds a collective): on rank
    0, the CPU seconds per role since the last mark."""

    def __init__(self, rank: int, driver_pid: int, storage_agent_pid: int | None) -> None:
        import torch.distributed as dist

        pids: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(pids, os.getpid())
        self.rank, self.root = rank, driver_pid
        self.roles = {f"rank {r}": pid for r, pid in enumerate(pids)}
        self.roles[STORAGE_AGENT] = storage_agent_pid
        self.last: dict[int, tuple[str, float]] | None = None

    def mark(self) -> dict[str, float] | None:
        """A barrier, rank 0's snapshot, a barrier: the CPU seconds per role since the
        last mark (None at the first, and on every other rank)."""
        import torch.distributed as dist

        dist.barrier()
        spent = None
        if self.rank == 0:
            now = cpu.snapshot(self.roles, root=self.root)
            spent = None if self.last is None else cpu.spent(self.last, now)
            self.last = now
        dist.barrier()
        return spent


def add_phase_cpu(row: dict[str, Any], ranks: list[dict[str, Any]]) -> None:
    """The row's CPU seconds per role of each phase, as rank 0 measured them."""
    for phase in PHASES:
        row[f"{phase}_cpu_s"] = ranks[0][f"{phase}_cpu_s"]


def in_order(roles: set[str]) -> list[str]:
    """The ranks, the storage agent, Ray's daemons, the driver, the rest, the total."""
    first = sorted(role for role in roles if role.startswith("rank "))
    known = [STORAGE_AGENT, *cpu.DAEMONS, "driver", "other"]
    rest = sorted(roles - {*first, *known, "total"})
    return [*first, *(role for role in known if role in roles), *rest, "total"]


def format_phase_cpu(rows: list[dict[str, Any]]) -> str:
    """A line per contender: CPU seconds of each role, save / restore."""
    lines = []
    for r in rows:
        if r["status"] != "ok" or not r.get("save_cpu_s"):
            continue
        phases = [r[f"{phase}_cpu_s"] for phase in PHASES]
        each = ", ".join(
            f"{role} " + "/".join(f"{p.get(role, 0.0):.2f}" for p in phases)
            for role in in_order({role for p in phases for role in p})
        )
        lines.append(f"  {r['contender']}: {each}")
    if not lines:
        return ""
    return "CPU s per process, save/restore (all of the session's processes):\n" + "\n".join(lines)
