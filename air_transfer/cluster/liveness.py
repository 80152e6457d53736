"""Whether the processes that began work somewhere still run, so that what a dead
one left (node storage's upload of a writer that was killed) can be cleaned up: a
process is named by its node and the lock it holds there for its life
(``core.process_locks``), which that node's agent judges.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable

from air_transfer.cluster.agent_client import AgentClient, AgentSelf
from air_transfer.cluster.fetch import get
from air_transfer.cluster.nodes import live_node_ids, this_node_id
from air_transfer.core import process_locks
from air_transfer.core.process_locks import Process

logger = logging.getLogger(__name__)


def this_process() -> Process:
    """This process (its lock taken on first use)."""
    return Process(this_node_id(), process_locks.hold())


def dead(processes: Iterable[Process], timeout_s: float = 60) -> set[Process]:
    """Those of ``processes`` known to be dead: their node left the cluster, or its
    agent took their lock. One whose node's agent does not answer is not (a later
    call asks again)."""
    by_node: defaultdict[str, set[Process]] = defaultdict(set)
    for p in processes:
        by_node[p.node_id].add(p)
    live, here = live_node_ids(), this_node_id()
    found: set[Process] = set()
    for node, procs in by_node.items():
        if node not in live:
            found |= procs
            continue
        if node == here:  # this node's lock files: judged here, no call
            gone = set(process_locks.dead(p.lock for p in procs))
            found |= {p for p in procs if p.lock in gone}
            continue
        try:
            gone = set(
                get(
                    AgentClient(node).call(AgentSelf.dead_processes, [p.lock for p in procs]),
                    timeout_s,
                )
            )
        except Exception as e:  # asked again at the next call
            logger.debug("air-transfer: node %s could not tell which processes died: %s", node, e)
            continue
        found |= {p for p in procs if p.lock in gone}
    return found
