"""Node storage with ``placement="writer"``: a repair of a placed file holds the
replica registry's claim on its blob while it runs (``claimed``), so that two
repairs of one file (the registry's background pass and a user's ``repair_holders``,
or two users') never run at once, in any processes, on any nodes: the one whose
copy or swap failed could otherwise delete a copy the other then names
(``storage.server.placed_claims`` says why a claim, and what frees one whose owner
died).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator

import ray

from air_transfer.cluster.nodes import this_node_id
from air_transfer.storage.client import replica_set
from air_transfer.storage.replica_wire import Owner, RegistryCalls

logger = logging.getLogger(__name__)

#: The longest pause between two asks for a claim held by another repair (seconds).
MAX_PAUSE_S = 0.5


@contextlib.contextmanager
def claimed(key: str, blob: str) -> Iterator[None]:
    """Hold the claim on placed ``blob`` of storage ``key`` for the block, waiting
    (asking again) while another repair holds it; given back after the block, however
    it ends (a process killed in it: once Ray knows it is dead)."""
    claim = uuid.uuid4().hex
    owner = Owner(ray.get_runtime_context().get_worker_id(), this_node_id())
    replica_set.until_granted(
        lambda: (
            True if replica_set.call(RegistryCalls.claim_placed, key, blob, claim, owner) else None
        ),
        (0.005, MAX_PAUSE_S),
        f"a repair of placed bytes {blob} in node storage {key}",
        "another repair of them",
    )
    try:
        yield
    finally:
        try:
            replica_set.call(RegistryCalls.release_placed, key, blob, claim)
        except Exception as e:  # freed once this process is dead
            logger.warning(
                "air-transfer: the claim on placed bytes %s in %s was not given back (%s: %s)",
                blob,
                key,
                type(e).__name__,
                e,
            )
