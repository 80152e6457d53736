"""Name -> strategy class, and the one pure function that picks a strategy by size.

Modelled on fsspec's ``registry.py``: a private dict, a read-only ``MappingProxyType``
view, and a ``register`` that refuses to replace a name silently. No Ray here, so the
registry and selection are unit-tested without a cluster.
"""

from __future__ import annotations

from types import MappingProxyType

from air_transfer.config import TransferConfig
from air_transfer.knobs import KNOBS
from air_transfer.strategies.base import TransferStrategy

_registry: dict[str, type[TransferStrategy]] = {}

#: Read-only view of the registered strategies, name -> class.
strategies = MappingProxyType(_registry)


def register_strategy(cls: type[TransferStrategy], clobber: bool = False) -> type[TransferStrategy]:
    """Register ``cls`` under ``cls.name`` (usable as a class decorator).

    Raises ValueError if the name is taken by another class and ``clobber`` is False,
    TypeError if ``cls`` is not a TransferStrategy subclass with a string ``name``.
    """
    if not (isinstance(cls, type) and issubclass(cls, TransferStrategy)):
        raise TypeError(f"register_strategy expects a TransferStrategy subclass, got {cls!r}")
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.__qualname__}.name must be a non-empty str, got {name!r}")
    existing = _registry.get(name)
    if existing is not None and existing is not cls and not clobber:
        raise ValueError(
            f"strategy name {name!r} is already registered to "
            f"{existing.__module__}.{existing.__qualname__}; pass clobber=True to replace it"
        )
    _registry[name] = cls
    return cls


def get_strategy(name: str) -> type[TransferStrategy]:
    """The strategy class registered as ``name``; ValueError listing the known names."""
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(
            f"unknown transfer strategy {name!r}; registered: {', '.join(sorted(_registry))}"
        ) from None


def select_strategy(
    total_bytes: int, config: TransferConfig, store_free_bytes: int | None = None
) -> str:
    """Pick the strategy for a checkpoint of ``total_bytes``: an explicit
    ``config.strategy`` wins (and must be registered); otherwise ``inline`` up to
    ``config.inline_max_bytes``, ``streamed`` when the checkpoint would not fit in
    the free object store (``store_free_bytes``, if known), and ``chunked`` between."""
    if isinstance(total_bytes, bool) or not isinstance(total_bytes, int) or total_bytes < 0:
        raise ValueError(f"total_bytes must be a non-negative int, got {total_bytes!r}")
    if config.strategy is not None:
        get_strategy(config.strategy)
        return config.strategy
    if total_bytes <= config.inline_limit:
        return "inline"
    if (
        store_free_bytes is not None
        and total_bytes > KNOBS.stream_above_store_fraction * store_free_bytes
    ):
        return "streamed"
    return "chunked"
