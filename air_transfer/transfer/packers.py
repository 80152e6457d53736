"""Where, and by whom, a transfer's chunks are packed: chosen by one pure function
from what the strategy's payload is (its ``Layout``) and where the caller stands.

A strategy says what the payload is; a packer makes one. ``HERE`` is the
strategy's own ``pack`` in this process; the others fill a built-in layout in this
node's agent, out of the caller's Python, and return before the bytes are packed:
``AGENT`` (its tasks: ``agent_tasks``), ``SHARED`` (with a caller that waits
anyway: ``shared_pack``), ``LIVE`` (an agent's transfer reusing the chunks of
earlier ones: ``live_chunks``). Where the transfer itself starts (this thread, a
background thread that relays the checkpoint, the node agent that owns it) is
``transfer.route``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import ray.cloudpickle

from air_transfer.core.scan import Source
from air_transfer.observe import metrics
from air_transfer.transfer.agent_tasks import pack_in_agent, submit_plans
from air_transfer.transfer.live_chunks import LiveChunks
from air_transfer.transfer.shared_pack import pack_shared
from air_transfer.transfer.strategies.base import Layout, Packed, PackRequest, TransferStrategy


class Packer(Enum):
    """Who packs a transfer's chunks, and where."""

    #: The strategy's ``pack``, in this process, returning once every chunk is stored.
    HERE = "here"
    #: Tasks in this node's agent, submitted at once (``agent_tasks``).
    AGENT = "agent"
    #: A blocking caller and its agent, every other chunk each (``shared_pack``).
    SHARED = "shared"
    #: The live chunks of the same file versions, the agent's tasks for the rest
    #: (``live_chunks``: an agent's ``reuse_chunks`` transfer).
    LIVE = "live"


def agent_can_read(source: Source) -> bool:
    """Whether ``source`` can be sent to the agent: a filesystem that lives only in
    this process (a ``PyFileSystem`` over a local object) cannot, and is then packed
    here by the strategy's ``pack``."""
    try:
        ray.cloudpickle.dumps(source)
    except Exception:
        return False
    return True


def select_packer(layout: Layout, *, agent_reads: bool, blocking: bool, reuse: bool) -> Packer:
    """The packer for a payload of ``layout``, first rule that applies:

    1. ``HERE`` for a ``CUSTOM`` layout (only the strategy knows it), or a source the
       agent cannot be sent (``agent_reads`` False: a filesystem that lives only in
       this process);
    2. ``LIVE`` for ``CHUNKS`` when live chunks may be ``reuse``d;
    3. ``SHARED`` for ``CHUNKS`` when the caller is ``blocking`` (waits until every
       chunk is stored, so its process may store some);
    4. ``AGENT``.

    Pure: it reads its arguments only.
    """
    if layout is Layout.CUSTOM or not agent_reads:
        return Packer.HERE
    if layout is Layout.CHUNKS and reuse:
        return Packer.LIVE
    if layout is Layout.CHUNKS and blocking:
        return Packer.SHARED
    return Packer.AGENT


def pack(
    packer: Packer,
    strategy: TransferStrategy,
    request: PackRequest,
    live: LiveChunks | None = None,
    transfer_id: str = "",
) -> Packed:
    """Pack ``request`` for ``strategy`` with ``packer`` (``LIVE`` records the chunks
    in ``live`` as ``transfer_id``'s), once the strategy accepts the request
    (``TransferStrategy.check``; its own ``pack`` checks for itself)."""
    if packer is not Packer.HERE:
        strategy.check(request.source, request.total_bytes, request.config)
    return _PACKERS[packer](strategy, request, live, transfer_id)


def _here(
    strategy: TransferStrategy, request: PackRequest, live: LiveChunks | None, transfer_id: str
) -> Packed:
    """The strategy's own ``pack``; the bytes count as packed once it returns (the
    agent's tasks count those they pack)."""
    packed = strategy.pack(request)
    if not packed.pending:
        metrics.add_bytes("packed", request.total_bytes, strategy.name)
    return packed


def _agent(
    strategy: TransferStrategy, request: PackRequest, live: LiveChunks | None, transfer_id: str
) -> Packed:
    """Tasks in this node's agent, for the strategy's layout."""
    return pack_in_agent(strategy.layout, request)


def _shared(
    strategy: TransferStrategy, request: PackRequest, live: LiveChunks | None, transfer_id: str
) -> Packed:
    """This process and its agent, every other chunk each."""
    return pack_shared(request)


def _live(
    strategy: TransferStrategy, request: PackRequest, live: LiveChunks | None, transfer_id: str
) -> Packed:
    """The live chunks of the same file versions, the agent's tasks for the rest."""
    assert live is not None, "LIVE packs with the live chunks of an agent"
    return live.reuse(request, transfer_id, submit_plans)


#: Each packer's function.
_PACKERS: dict[
    Packer, Callable[[TransferStrategy, PackRequest, LiveChunks | None, str], Packed]
] = {
    Packer.HERE: _here,
    Packer.AGENT: _agent,
    Packer.SHARED: _shared,
    Packer.LIVE: _live,
}
