"""CPU seconds a round trip costs, per process of the Ray session: unlike wall time,
they hardly depend on what else the machine runs, so they show where a trip's work
goes even on a shared, loaded machine.

A snapshot is the user + system CPU time (``/proc/<pid>/stat``) of the driver and
every process under it (a local Ray's GCS, raylet, workers and their children),
named by role: the trip's producer, consumer and packing agent by pid, Ray's own
daemons by name, the rest as ``other``. Kernel threads (the disk's completion work,
page reclaim) belong to no process and are not counted.
"""

from __future__ import annotations

import os

import psutil

#: Ray's daemons, named by their process names.
DAEMONS = ("raylet", "gcs_server")


def snapshot(roles: dict[str, int | None], root: int | None = None) -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for the driver and its process tree;
    ``roles`` names known pids (producer, consumer, agent). ``root``: the driver's
    pid, for a snapshot taken by another process of the session (a Train rank)."""
    named = {pid: role for role, pid in roles.items() if pid}
    me = psutil.Process(root or os.getpid())
    found: dict[int, tuple[str, float]] = {}
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
            name = proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        role = named.get(proc.pid)
        if role is None:
            role = "driver" if proc.pid == me.pid else name if name in DAEMONS else "other"
        found[proc.pid] = (role, times.user + times.system)
    return found


def spent(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]
) -> dict[str, float]:
    """CPU seconds per role between two snapshots (a process started in between
    counts from zero; one that exited in between is lost), and their ``total``."""
    per_role: dict[str, float] = {}
    for pid, (role, seconds) in after.items():
        start = before.get(pid, (role, 0.0))[1]
        per_role[role] = per_role.get(role, 0.0) + max(0.0, seconds - start)
    per_role["total"] = sum(per_role.values())
    return {role: round(seconds, 4) for role, seconds in per_role.items()}
