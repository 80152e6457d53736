"""Hold one node storage call inside a node's agent at a Gate, so that a race of
replicated changes is a state, not a timing: "the commit is done on one copy and
not yet on the other" holds until the test opens the gate.

``hold(node_id, "_uploads", "fs_commit", gate, match="f")`` makes the first call of
that method of a part of node storage's service (``NodeStorageService._uploads``) in
that node's agent whose arguments (or their fields: a ``Commit``'s) name a path
containing ``match`` arrive at ``gate`` and wait; then it runs (or, ``drop=True``,
returns without running: the call as if its caller had died before sending it; or,
``fail=True``, raises OSError EIO without running: a fault of the disk there). The
rest run as always.
``release(node_id, ...)`` puts the method back.
"""

from __future__ import annotations

import errno
import threading
from dataclasses import dataclass, field, is_dataclass
from typing import Any

import ray

from air_transfer import node_agent

_fired = threading.Lock()  # in the agent's process: one call held, of many at once


@dataclass
class Hold:
    gate: Any
    match: str
    drop: bool
    fail: bool = False
    fired: list[bool] = field(default_factory=list)

    def take(self, args: tuple[Any, ...]) -> bool:
        named = any(isinstance(a, str) and self.match in a for a in _named(args))
        with _fired:
            if self.fired or not named:
                return False
            self.fired.append(True)
            return True


def _named(args: tuple[Any, ...]) -> list[Any]:
    """The arguments, and the fields of those that are dataclasses."""
    fields = [vars(a).values() for a in args if is_dataclass(a) and not isinstance(a, type)]
    return [*args, *(v for f in fields for v in f)]


def _install(agent: Any, service: str, method: str, hold: Hold) -> None:
    svc = getattr(agent._storage, service)
    original = getattr(type(svc), method)

    def held(*args: Any, **kwargs: Any) -> Any:
        if hold.take(args):
            ray.get(hold.gate.arrive_and_wait.remote())
            if hold.drop:
                return None
            if hold.fail:
                raise OSError(errno.EIO, f"injected fault of {method}", hold.match)
        return original(svc, *args, **kwargs)

    setattr(svc, method, held)


def _remove(agent: Any, service: str, method: str) -> None:
    svc = getattr(agent._storage, service)
    if method in vars(svc):
        delattr(svc, method)


def hold(
    node_id: str,
    service: str,
    method: str,
    gate: Any,
    match: str = "",
    drop: bool = False,
    fail: bool = False,
) -> None:
    """Hold the first matching call of ``service.method`` in ``node_id``'s agent."""
    agent = node_agent(node_id)
    held = Hold(gate, match, drop, fail)
    ray.get(agent.__ray_call__.remote(_install, service, method, held))


def release(node_id: str, service: str, method: str) -> None:
    ray.get(node_agent(node_id).__ray_call__.remote(_remove, service, method))
