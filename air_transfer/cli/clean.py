"""``air-transfer clean ROOT``: what dead writers left under ROOT in node storage,
removed where the storage node proves the writer gone (``storage.server.leftovers``
says how each kind is judged), on every copy of a replicated storage; and, for
ROOT a writer-placed storage's root, the blobs on its holder nodes that no stub
names and no live writer may still name (``storage.client.placed_sweep``).

The walk runs where the files are: a task pinned to each copy's node, holding no lock
of its own, so that the lock of every writer there, the agent's included, is judged
from outside as any other process would.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.exceptions import RayTaskError
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from air_transfer.cli.output import human_bytes, table
from air_transfer.cli.session import Storage, placed_handler
from air_transfer.cli.trees import join, relative_to
from air_transfer.cluster.fetch import get, raise_own
from air_transfer.storage.server.leftovers import Leftover, clean_tree


def clean(storage: Storage, top: str, dry_run: bool, upload_age_s: float) -> list[dict[str, Any]]:
    """Every leftover under ``top`` on each copy (and, ``top`` the root of a
    writer-placed storage, on its holders), judged and (unless ``dry_run``)
    removed; one JSON-ready record each."""
    remote: Any = ray.remote
    task = remote(num_cpus=0, max_retries=0)(clean_tree)
    rel = relative_to(storage.root, top)
    refs = [
        (
            node,
            join(root, rel),
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(join(root, rel), dry_run=dry_run, upload_age_s=upload_age_s),
        )
        for node, root in storage.members
    ]
    records: list[dict[str, Any]] = []
    placed = placed_handler(storage) if top == storage.root else None
    for node, root, ref in refs:
        try:
            found: list[Leftover] = get(ref)
        except RayTaskError as e:
            raise_own(e)  # the storage node's FileNotFoundError, PermissionError...
            raise
        records.extend(
            {
                "node": node,
                "path": join(root, leftover.path),
                "kind": leftover.kind,
                "bytes": leftover.nbytes,
                "action": leftover.action,
            }
            for leftover in found
        )
    if placed is not None:  # after the walks: a dead writer's staging is gone by then
        records.extend(
            {
                "node": swept.node,
                "path": swept.path,
                "kind": swept.kind,
                "bytes": swept.nbytes,
                "action": swept.action,
            }
            for swept in placed.sweep_placed(dry_run)
        )
    return records


def render(records: list[dict[str, Any]], dry_run: bool) -> str:
    """The table ``clean`` prints, and a line of totals."""
    rows = [
        [r["path"], r["kind"], human_bytes(r["bytes"]), r["action"], r["node"][:12]]
        for r in records
    ]
    done = [r for r in records if r["action"] in ("removed", "would remove")]
    verb = "would remove" if dry_run else "removed"
    freed = human_bytes(sum(r["bytes"] for r in done))
    total = f"{verb} {len(done)} of {len(records)} hidden entries, {freed}"
    if not records:
        return "nothing left behind"
    headers = ["ENTRY", "KIND", "SIZE", "ACTION", "NODE"]
    return f"{table(headers, rows, right=('SIZE',))}\n{total}"
