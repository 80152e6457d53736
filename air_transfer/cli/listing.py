"""``air-transfer ls ROOT``: the checkpoints under ROOT in node storage, each with
its size, age and where it is kept (``air_transfer.list_checkpoints``: on this many
nodes, in the durable tier or not, whether or not ``--durable`` names the tier).
"""

from __future__ import annotations

import time
from typing import Any

from air_transfer.cli.output import human_age, human_bytes, table
from air_transfer.cli.session import Storage
from air_transfer.storage.client.checkpoints import list_checkpoints as checkpoints_under


def list_checkpoints(storage: Storage, top: str) -> list[dict[str, Any]]:
    """Each checkpoint under ``top`` of ``storage`` as ``ls --json``'s record."""
    now = time.time_ns()
    return [info.to_dict(now) for info in checkpoints_under(storage.filesystem, top)]


def state_text(record: dict[str, Any]) -> str:
    """Where a checkpoint is kept, in words: ``local``, ``on 2 copies``, ``durable``
    (and still on node storage), ``durable only`` (a run resumed on a new cluster)."""
    copies = record["copies"]
    if record["durable"]:
        return "durable only" if copies == 0 else "durable"
    if copies > 1:
        return f"on {copies} copies"
    return "local" if record["durable"] is None else "local, not yet durable"


def render(records: list[dict[str, Any]]) -> str:
    """The table ``ls`` prints."""
    rows = [
        [
            r["path"],
            human_bytes(r["bytes"]),
            r["files"],
            human_age(r["age_s"]) if r["age_s"] is not None else None,
            "dcp" if r["dcp"] else "files",
            state_text(r),
        ]
        for r in records
    ]
    headers = ["CHECKPOINT", "SIZE", "FILES", "AGE", "KIND", "STATE"]
    return table(headers, rows, right=("SIZE", "FILES", "AGE"))
