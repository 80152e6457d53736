"""Node storage replicas, the fence: no change of a replicated storage lands on a
copy after the operation it belongs to was resolved without its caller.

A caller that dies mid-change leaves calls it submitted to the copies' agents: Ray
runs an actor call whoever is left to read its answer, so one queued or running
when the registry resolves the operation (``dead_ops``) would land afterwards, on
copies already made to agree. Each change carries its operation's id; ``fence``
refuses every later call of an operation and waits until the ones running are
done, so that what the copies hold once it returns is final.

Runs in every node's agent. Plain Python: unit-tested without Ray.
"""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator

from air_transfer.core.fence import Fence

#: How long an operation's id stays fenced (its caller's calls are long gone).
KEEP_S = 3600.0


class OpFence:
    """The operations whose calls this agent runs now, and those fenced off."""

    def __init__(self) -> None:
        self._fence = Fence(keep_s=KEEP_S)

    @contextlib.contextmanager
    def running(self, op: str) -> Iterator[None]:
        """Run one call of operation ``op`` ('' for a call of no operation);
        PermissionError if the operation was fenced off."""
        if not op:
            yield
            return
        with self._fence.running(op, lambda: _refused(op)):
            yield

    def fence(self, ops: list[str], timeout_s: float) -> list[str]:
        """Refuse every later call of ``ops``; wait up to ``timeout_s`` for their
        calls running now. Returns those still running (none: fenced whole)."""
        return self._fence.fence(ops, timeout_s)


def _refused(op: str) -> PermissionError:
    return PermissionError(
        errno.EACCES,
        f"operation {op} was resolved after its caller died; this call of it arrived late "
        "and was refused",
    )
