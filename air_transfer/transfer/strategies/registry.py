"""Name -> strategy class, the size rules users add, and the one pure function that
picks a strategy by size.

Modelled on fsspec's ``registry.py``: private dicts, read-only ``MappingProxyType``
views, and a ``register`` that refuses to replace anything silently. No Ray here, so
the registry and selection are unit-tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from air_transfer.config import TransferConfig
from air_transfer.core.knobs import KNOBS
from air_transfer.transfer.strategies.base import TransferStrategy

_registry: dict[str, type[TransferStrategy]] = {}
_size_rules: dict[str, int] = {}

#: Read-only view of the registered strategies, name -> class.
strategies = MappingProxyType(_registry)
#: Read-only view of the size rules, name -> ``select_above_bytes``: the strategies
#: that size-based selection picks for a checkpoint of more than that many bytes.
size_rules = MappingProxyType(_size_rules)


def register_strategy(
    cls: type[TransferStrategy],
    clobber: bool = False,
    *,
    select_above_bytes: int | None = None,
) -> type[TransferStrategy]:
    """Register ``cls`` under ``cls.name`` (usable as a class decorator without
    arguments).

    With ``select_above_bytes``, ``select_strategy`` also picks it by size, for a
    checkpoint of more than that many bytes (0: every checkpoint that is not empty),
    before the built-in rules; see ``select_strategy`` for the precedence. Without
    it, the strategy is used only when named in ``TransferConfig(strategy=...)``.

    A registration is the class and its size rule together. Registering the same
    class with the same rule again is a no-op; anything else under a taken name (an
    other class, or the same class with another rule or none) raises ValueError
    unless ``clobber`` is True, and so does a ``select_above_bytes`` that another
    strategy's rule already uses (the choice between them would be arbitrary).
    TypeError if ``cls`` is not a TransferStrategy subclass with a string ``name``
    or ``select_above_bytes`` not an int; ValueError if it is negative.
    """
    if not (isinstance(cls, type) and issubclass(cls, TransferStrategy)):
        raise TypeError(f"register_strategy expects a TransferStrategy subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__}.name must be a non-empty str, got {name!r}")
    if select_above_bytes is not None:
        _check_threshold(name, select_above_bytes)
    existing = _registry.get(name)
    if existing is not None and not clobber:
        if existing is not cls:
            raise ValueError(
                f"strategy name {name!r} is already registered to "
                f"{existing.__module__}.{existing.__qualname__}; pass clobber=True to "
                "replace it"
            )
        if _size_rules.get(name) != select_above_bytes:
            raise ValueError(
                f"strategy {name!r} is already registered with "
                f"{_describe_rule(_size_rules.get(name))}, not "
                f"{_describe_rule(select_above_bytes)}; pass clobber=True to replace it"
            )
    for other, threshold in _size_rules.items():
        if other != name and threshold == select_above_bytes:
            raise ValueError(
                f"strategy {other!r} is already selected above {threshold} bytes; give "
                f"{name!r} another select_above_bytes (the larger threshold wins above it)"
            )
    _registry[name] = cls
    if select_above_bytes is None:
        _size_rules.pop(name, None)
    else:
        _size_rules[name] = select_above_bytes
    return cls


def _check_threshold(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"select_above_bytes of {name!r} must be an int, got {value!r}")
    if value < 0:
        raise ValueError(f"select_above_bytes of {name!r} must be >= 0, got {value}")


def _describe_rule(threshold: int | None) -> str:
    return "no size rule" if threshold is None else f"select_above_bytes={threshold}"


@dataclass(frozen=True)
class Registrations:
    """Strategies and size rules of another process, read in place of this one's
    (``registrations``): the ``owner="node"`` agent packs with those of the process
    that called ``to_object_ref``, which registered them."""

    #: Name -> class, read before this process's registry.
    strategies: Mapping[str, type[TransferStrategy]] = field(default_factory=dict)
    #: Name -> ``select_above_bytes``: replaces this process's size rules.
    size_rules: Mapping[str, int] = field(default_factory=dict)


def registrations(config: TransferConfig) -> Registrations:
    """What ``select_strategy`` may pick for ``config`` in this process: the strategy
    ``config.strategy`` names (ValueError if none is registered so), else every size
    rule and its strategy. Built-in strategies are registered in every process."""
    if config.strategy is not None:
        return Registrations({config.strategy: get_strategy(config.strategy)})
    return Registrations({name: _registry[name] for name in _size_rules}, dict(_size_rules))


def get_strategy(name: str, registered: Registrations | None = None) -> type[TransferStrategy]:
    """The strategy class registered as ``name`` (in ``registered``, else in this
    process); ValueError listing the known names."""
    if registered is not None and name in registered.strategies:
        return registered.strategies[name]
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(
            f"unknown transfer strategy {name!r}; registered: {', '.join(sorted(_registry))}"
        ) from None


def select_strategy(
    total_bytes: int,
    config: TransferConfig,
    store_free_bytes: int | None = None,
    registered: Registrations | None = None,
) -> str:
    """The name of the strategy for a checkpoint of ``total_bytes``, first rule that
    applies:

    1. ``config.strategy``, if set (it must be registered);
    2. a registered size rule: of the strategies registered with
       ``select_above_bytes`` below ``total_bytes``, the one with the largest
       threshold (the most specific rule; thresholds are unique);
    3. ``inline`` up to ``config.inline_max_bytes``;
    4. ``streamed`` when the checkpoint would not fit in the free object store
       (more than ``KNOBS.stream_above_store_fraction`` of ``store_free_bytes``, if
       known);
    5. ``chunked``.

    User rules come before the built-in ones so that a rule means what it says
    whatever the object store holds. Pure: it reads the registry (or ``registered``,
    another process's: see ``Registrations``) and its arguments.
    """
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 0:
        raise ValueError(f"total_bytes must be a non-negative int, got {total_bytes!r}")
    if config.strategy is not None:
        get_strategy(config.strategy, registered)
        return config.strategy
    rules = _size_rules if registered is None else registered.size_rules
    applicable = [(t, name) for name, t in rules.items() if total_bytes > t]
    if applicable:
        return max(applicable)[1]
    if total_bytes <= config.inline_limit:
        return "inline"
    if (
        store_free_bytes is not None
        and total_bytes > KNOBS.stream_above_store_fraction * store_free_bytes
    ):
        return "streamed"
    return "chunked"
