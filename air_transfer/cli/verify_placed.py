"""``air-transfer verify`` of node storage with ``placement="writer"``: a placed
file's copies keep only its stub, so its bytes are checked where they are: on every
holder the stub's record names, against the checksums its writer recorded
(``placed_sums.holder_problem``: the holder's checksums pinned by the record, every
chunk of its blob checked by the holder's own agent). Every copy's stub must name
the same record; a holder lost, or whose bytes do not match, is a problem
(``repair_holders`` brings back K good holders).
"""

from __future__ import annotations

from air_transfer.cli.session import CONFIG, Storage
from air_transfer.cluster.nodes import live_node_ids
from air_transfer.storage.client.placed_sums import Links, holder_problem
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import NodeReads
from air_transfer.storage.placed_record import PLACE_MIN_BYTES, RECORD_BYTES, decode


def stub_of(storage: Storage, node: str, root: str, path: str, size: int) -> bytes | None:
    """The record at the head of ``path`` on the copy ``root`` of ``node`` if it is
    a placed file's stub there (None: a file of its own bytes)."""
    if storage.replica_root is None or size < PLACE_MIN_BYTES:
        return None
    found = AgentLink(node, root, CONFIG).call(NodeReads.placed_head, root, path, RECORD_BYTES)
    return None if found is None else found[1]


def holder_problems(storage: Storage, path: str, size: int, head: bytes) -> tuple[int, list[str]]:
    """How many holders of placed file ``path`` (its stub's record ``head``) hold
    its bytes whole, and what is wrong with each of the others."""
    try:
        record = decode(head, size, path, storage.replica_root or "")
    except ValueError as e:
        return 0, [str(e)]
    links, live, good, problems = Links(CONFIG), live_node_ids(), 0, []
    for holder in record.holders:
        name = f"the holder on node {holder[0][:12]}"
        if holder[0] not in live:
            problems.append(f"{name} is lost (repair_holders brings back K holders)")
            continue
        problem = holder_problem(links, path, record, holder)
        if problem is None:
            good += 1
        else:
            problems.append(f"{name} does not match the record: {problem}")
    return good, problems
