"""Node storage, the two rules every change obeys, applied once for all: each call a
Protocol of ``storage.node_api`` declares a ``change`` runs fenced by its ``op``
(``op_fence``: a replicated change whose caller died is refused once resolved), and
then wakes the durable tier's drain of its ``root``, whether it raised or not (a
change that failed may have changed part of the root). The agent applies them to
every call it serves (``cluster.rpc.Services``' ``around``), so no method of a
service writes either, and a new change cannot forget them: declared a change, it
has both; taking an ``op`` without being declared one, it is refused when the agent
starts.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from air_transfer.storage.node_api import is_change
from air_transfer.storage.server.op_fence import OpFence


class ChangeRules:
    """Fence each change with ``fence`` and call ``wake(root)`` after it."""

    def __init__(self, fence: OpFence, wake: Callable[[str], None]) -> None:
        self.fence, self.wake = fence, wake

    def around(self, declared: Callable[..., Any], bound: Callable[..., Any]) -> Callable[..., Any]:
        """What runs for a call of ``declared``: ``bound`` itself, or for a change,
        ``bound`` fenced and followed by the wake. TypeError if ``declared`` takes an
        ``op`` but is no change, or is a change of no ``root``."""
        names = list(inspect.signature(declared).parameters)[1:]  # less self
        if not is_change(declared):
            if "op" in names:
                raise TypeError(f"{declared.__qualname__} takes an op: declare it a change")
            return bound
        if "root" not in names:
            raise TypeError(f"{declared.__qualname__} is a change of no root")
        root_at, op_at = names.index("root"), names.index("op") if "op" in names else None

        @functools.wraps(bound)
        def change(*args: Any, **kwargs: Any) -> Any:
            root = args[root_at] if root_at < len(args) else kwargs["root"]
            op = kwargs.get("op", "")
            if op_at is not None and op_at < len(args):
                op = args[op_at]
            try:
                with self.fence.running(op):
                    return bound(*args, **kwargs)
            finally:
                self.wake(root)

        return change
