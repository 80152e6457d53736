"""Typed calls to an actor's services: each call declared once, where callers can see it.

An actor that hosts services (the node agent, the replica registry) has one Ray
method, ``call(method, *args)``: the caller passes a declared method
(``agent.call(PackingService.pack_chunks, source, plans)``), so mypy checks the
arguments against its one signature (``Callable[Concatenate[S, P], R]`` -> ``P``),
and the actor runs the method of that name on the service it hosts that declares
it (``Services``). A call is declared once: by the service's own method, marked
``served``, where its callers may import the service; else by a Protocol below both
rooms, which the service derives from (node storage's server side, from its client
side). Only declared methods are served. Ray pickles the method by reference (its
module and name).
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
_SERVED = "__air_transfer_served__"


def in_group(group: str) -> Callable[[F], F]:
    """Run calls of the decorated service method in the actor's concurrency group
    ``group`` (its own threads), as the caller asks Ray when it makes the call."""

    def mark(method: F) -> F:
        setattr(method, _GROUP, group)
        return method

    return mark


def served(method: F) -> F:
    """Declare the decorated method of a service a call its actor serves: callers
    name it (``Service.method``), its signature the one they are checked against."""
    setattr(method, _SERVED, True)
    return method


def group_of(method: Callable[..., Any]) -> str | None:
    """The concurrency group ``in_group`` gave ``method`` (None: the default)."""
    group: str | None = getattr(method, _GROUP, None)
    return group


class Services:
    """The services an actor hosts, found by a method their Protocols declare. What
    runs for a call of ``declared`` is ``around(declared, bound)``, where ``bound``
    calls the service's method of that name, looked up at each call (default:
    ``bound`` itself): the rules a host applies to every call of a kind, written
    once. TypeError at construction if two services serve one method, or a declared
    method is left unwritten (its stub would answer None)."""

    def __init__(
        self,
        *services: object,
        around: Callable[[Callable[..., Any], Callable[..., Any]], Callable[..., Any]]
        | None = None,
    ) -> None:
        self._bound: dict[Callable[..., Any], Callable[..., Any]] = {}
        for service in services:
            for name, declared in declared_calls(type(service)):
                if declared in self._bound:
                    raise TypeError(f"{declared.__qualname__} is served twice")
                if _is_protocol(_owner(type(service), name)):
                    raise TypeError(f"{type(service).__name__} does not write {name}")
                bound = _late(service, name)
                self._bound[declared] = bound if around is None else around(declared, bound)

    def bound(self, method: Callable[..., Any]) -> Callable[..., Any]:
        """What runs for a call of the declared ``method``."""
        try:
            return self._bound[method]
        except (KeyError, TypeError):
            raise TypeError(
                f"no service of this actor serves {method!r}: a call names a method "
                "that a Protocol of the service declares"
            ) from None

    def call(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return self.bound(method)(*args, **kwargs)

    def stream(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Iterator[Any]:
        yield from self.bound(method)(*args, **kwargs)


def _late(service: object, name: str) -> Callable[..., Any]:
    """A call of ``service``'s method ``name`` as it is when called (a method replaced
    on the object, as a test does to hold a call at a gate, is the one that runs)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(service, name)(*args, **kwargs)

    return call


def declared_calls(cls: type) -> Iterator[tuple[str, Callable[..., Any]]]:
    """``(name, method)`` of each call a service of class ``cls`` answers: the public
    methods the Protocols it derives from declare, and its methods marked ``served``."""
    for base in cls.__mro__:
        for name, method in vars(base).items():
            if name.startswith("_") or not inspect.isfunction(method):
                continue
            if (base is not cls and _is_protocol(base)) or getattr(method, _SERVED, False):
                yield name, method


def _owner(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO that defines ``name``."""
    return next(c for c in cls.__mro__ if name in vars(c))


def _is_protocol(cls: type) -> bool:
    return bool(getattr(cls, "_is_protocol", False))
