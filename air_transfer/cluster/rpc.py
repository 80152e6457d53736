"""Typed calls to an actor's services: each call declared once, by its method.

An actor that hosts services (the node agent, the replica registry) has one Ray
method, ``call(method, *args)``: the caller passes the service's method itself
(``agent.call(PackingService.pack_chunks, source, plans)``), so mypy checks the
arguments against the service's own signature (``Callable[Concatenate[S, P], R]``
-> ``P``), and the actor runs that method on the service object it hosts
(``Services``). A service the caller's layer cannot import (node storage's server
side, from its client side) is declared as a ``Protocol`` below both, which the
service subclasses: the caller passes the Protocol's method. Adding a call is adding
a method to the service. Ray pickles the method by reference (its module and name).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")
F = TypeVar("F", bound=Callable[..., Any])

_GROUP = "__air_transfer_concurrency_group__"


def in_group(group: str) -> Callable[[F], F]:
    """Run calls of the decorated service method in the actor's concurrency group
    ``group`` (its own threads), as the caller asks Ray when it makes the call."""

    def mark(method: F) -> F:
        setattr(method, _GROUP, group)
        return method

    return mark


def group_of(method: Callable[..., Any]) -> str | None:
    """The concurrency group ``in_group`` gave ``method`` (None: the default)."""
    group: str | None = getattr(method, _GROUP, None)
    return group


class Services:
    """The services an actor hosts, found by a method of theirs: the method of the
    service's class, or of any class it derives from (its Protocols). TypeError at
    construction if two serve one method, or a Protocol's method is left unwritten
    (its stub would answer None)."""

    def __init__(self, *services: object) -> None:
        self._bound: dict[Callable[..., Any], Callable[..., Any]] = {}
        for service in services:
            for cls in type(service).__mro__:
                for name, method in vars(cls).items():
                    if name.startswith("_") or not inspect.isfunction(method):
                        continue
                    if method in self._bound:
                        raise TypeError(f"{method.__qualname__} is served twice")
                    bound = getattr(service, name)
                    if _is_protocol(_owner(type(service), name)):
                        raise TypeError(f"{type(service).__name__} does not write {name}")
                    self._bound[method] = bound

    def bound(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """``method`` bound to the service that serves it."""
        try:
            return self._bound[method]
        except (KeyError, TypeError):
            raise TypeError(f"no service of this actor serves {method!r}") from None

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.bound(method)(*args, **kwargs)

    def stream(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from self.bound(method)(*args, **kwargs)


def _owner(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO that defines ``name``."""
    return next(c for c in cls.__mro__ if name in vars(c))


def _is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))
