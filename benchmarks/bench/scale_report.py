"""``bench --scale``'s rows and table: per run (a placement at N ranks) and per node,
bytes as shards."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.bench import pushed
from benchmarks.bench.report import aligned, num

SCALE_METRICS = {
    "received_per_round": "per node: bytes its raylet received (ray_object_manager_bytes, "
    "Type=Received) per report round, mean over the rounds, in shards",
    "sent_per_round": "per node: bytes its raylet pushed (from its store or spilled) per "
    "report round, mean over the rounds, in shards",
    "disk_shards": "per node: bytes allocated to the files under its roots (its copy and, "
    "with placement='writer', the bytes it holds) after the run, in shards",
    "own_shard_files": "per rank's node: copies of that rank's shard (known by content) "
    "under its roots",
    "restore_received": "per node: bytes its raylet received while every rank restored "
    "its own shard of the latest checkpoint at once, in shards",
    "restore_sent": "per node: bytes its raylet pushed meanwhile, in shards",
    "round_s": "per round: from the first rank's ray.train.report call to the last "
    "rank's return (SYNC: stored on every copy and committed)",
    "copies_x": "all nodes' disk bytes / the kept shards' bytes (num_to_keep x ranks)",
    "busiest_received_per_round": "the most any node's raylet received per round, in shards",
}


def _mean(values: list[float]) -> float:
    return round(statistics.fmean(values), 3) if values else 0.0


def node_row(
    node: str,
    per_round: list[pushed.Bytes],
    disk: int,
    restore: pushed.Bytes,
    shard: int,
    own_shard_files: int | None,
) -> dict[str, Any]:
    """One node's figures in shards of ``shard`` bytes: each round's bytes received
    and sent (and their means), its disk after the run, the restore's bytes."""
    received = [round(m.get(node, {}).get("Received", 0.0) / shard, 3) for m in per_round]
    sent = [round(pushed.pushed_from(m.get(node, {})) / shard, 3) for m in per_round]
    return {
        "received": received,
        "sent": sent,
        "received_per_round": _mean(received),
        "sent_per_round": _mean(sent),
        "disk_shards": round(disk / shard, 3),
        "own_shard_files": own_shard_files,
        "restore_received": round(restore.get(node, {}).get("Received", 0.0) / shard, 3),
        "restore_sent": round(pushed.pushed_from(restore.get(node, {})) / shard, 3),
    }


def run_row(
    placement: str,
    ranks: int,
    shard: int,
    rounds: int,
    error: str | None,
    *,
    nodes: dict[str, dict[str, Any]] | None = None,
    round_s: list[float] | None = None,
    restore_s: list[float] | None = None,
    kept: int = 0,
    moved: list[dict[str, Any]] | None = None,
    restore_moved: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One run's row: its nodes' figures and the totals the bars are held to (the
    storage node's own disk, every copy together against the kept shards, the
    busiest raylet per round). ``error``: why it failed (its figures, if any, stay)."""
    nodes = nodes or {}
    disk = round(sum(n["disk_shards"] for n in nodes.values()), 3)
    received = [n["received_per_round"] for n in nodes.values()]
    return {
        "contender": placement,
        "placement": placement,
        "ranks": ranks,
        "status": "ok" if error is None else "failed",
        "reason": error,
        "verified": error is None,
        "shard_bytes": shard,
        "rounds": rounds,
        "round_s": [round(s, 4) for s in round_s or []],
        "round_median_s": round(statistics.median(round_s), 4) if round_s else None,
        "restore_s": restore_s or [],
        "restore_max_s": max(restore_s) if restore_s else None,
        "nodes": nodes,
        "disk_shards": disk,
        "kept_shards": kept,
        "copies_x": round(disk / kept, 3) if kept else None,
        "busiest_received_per_round": max(received) if received else None,
        "storage_disk_shards": nodes["storage"]["disk_shards"] if "storage" in nodes else None,
        "pushed_per_round": moved or [],
        "restore_pushed": restore_moved or {},
    }


def format_scale_table(results: list[dict[str, Any]]) -> str:
    """A row per node of every run (bytes in shards), then the run's totals: its
    median round, every copy against the kept shards, verified or why not."""
    header = [
        "placement", "ranks", "node", "recv/round", "sent/round", "disk", "own_shards",
        "restore_recv", "restore_sent", "round_s", "restore_s", "copies_x", "verified",
    ]  # fmt: skip
    rows: list[list[str]] = []
    notes: list[str] = []
    for r in results:
        where = [r["placement"], str(r["ranks"])]
        for name, n in r["nodes"].items():
            own = "-" if n["own_shard_files"] is None else str(n["own_shard_files"])
            rows.append([
                *where, name, num(n["received_per_round"], 2), num(n["sent_per_round"], 2),
                num(n["disk_shards"], 2), own, num(n["restore_received"], 2),
                num(n["restore_sent"], 2), "", "", "", "",
            ])  # fmt: skip
        nodes = r["nodes"].values()
        rows.append([
            *where, "all", num(sum(n["received_per_round"] for n in nodes), 2),
            num(sum(n["sent_per_round"] for n in nodes), 2), num(r["disk_shards"], 2), "",
            num(sum(n["restore_received"] for n in nodes), 2),
            num(sum(n["restore_sent"] for n in nodes), 2), num(r["round_median_s"]),
            num(r["restore_max_s"]), num(r["copies_x"], 2), "yes" if r["verified"] else "no",
        ])  # fmt: skip
        if r["reason"]:
            notes.append(f"  {r['placement']} {r['ranks']} ranks {r['status']}: {r['reason']}")
    lines = aligned(header, rows, {0, 2})
    return "\n".join(lines + (["", "failed:", *notes] if notes else []))
