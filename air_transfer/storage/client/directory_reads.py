"""Node storage, the caller's side: a whole checkpoint directory read from a storage
node's agent as one shared transfer (Ray Train's restores, ``train.hooks`` and
``replica_train``).

The agent packs the directory once for every reader in flight and, while a reader
on another node reads it, hands this one its relay: copies of its chunks on that
other reader's node (``storage.server.directory_transfers``, ``transfer.fanout``),
so that N nodes restoring at once make the storage node push the checkpoint about
once. A relay's node is another reader's and may be lost mid-read: the read is then
made again from the transfer itself (its output is published whole, so nothing of
the first try is left). The lease goes back to the agent either way.
"""

from __future__ import annotations

import contextlib
import logging

import ray

from air_transfer.cluster.fetch import get
from air_transfer.cluster.nodes import this_node_id
from air_transfer.config import TransferConfig
from air_transfer.storage.client.replica_set import is_lost
from air_transfer.storage.client.streams import AgentLink
from air_transfer.storage.node_api import NodeReads

logger = logging.getLogger(__name__)


def read_directory(
    link: AgentLink, root: str, where: str, config: TransferConfig, local_path: str
) -> None:
    """Write the directory ``where`` of the storage root ``root`` of ``link``'s node
    into ``local_path``, from one transfer its agent shares between readers (or its
    relay). NotADirectoryError: ``where`` is a file."""
    node: str | None = this_node_id()
    while True:
        [ref, lease, relayed] = link.call(NodeReads.directory_transfer, root, where, config, node)
        try:
            get(ref).to_directory(local_path)
            return
        except Exception as e:
            if not (relayed and is_lost(e)):
                raise
            logger.warning(
                "air-transfer: the relay of %s on another reader's node was lost mid-read "
                "(%s); reading it from storage node %s",
                where,
                type(e).__name__,
                link.node_id[:12],
            )
            node = None  # the transfer itself, never a relay
        finally:
            with contextlib.suppress(ray.exceptions.RayError, ConnectionError):
                get(link.agent().call(NodeReads.release_directory_transfer, lease))
