"""The extension API: what a new transfer strategy, or a tool that reads a packed
checkpoint's parts, builds on. Using air-transfer needs none of it (that is the
package root, ``air_transfer``).

A strategy subclasses ``TransferStrategy`` (a ``name``; ``pack`` turns a
``PackRequest`` into ``Packed`` chunks, in the calling process; ``iter_chunks``
yields a payload's chunks in order; ``refs`` lists the ObjectRefs a payload holds,
by default a list of them) and is registered with ``register_strategy(cls,
select_above_bytes=None)``;
``TransferConfig(strategy=name)`` then picks it, or its size rule does.
``strategies()`` lists the registered names, ``get_strategy(name)`` gives a class,
``select_strategy(total_bytes, config, store_free)`` is the size-based choice.
``ChunkedCheckpoint.pack()`` returns a ``TransferHandle``: the ``Manifest`` (every
``Entry``: path, kind, size, mode, mtime; a checksum per chunk), the strategy and
its payload. ``examples/custom_strategy.py`` is a complete strategy.
"""

from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.transfer.handle import TransferHandle
from air_transfer.transfer.strategies import (
    Packed,
    PackRequest,
    TransferStrategy,
    get_strategy,
    register_strategy,
    select_strategy,
    strategies,
)

__all__ = [
    "Entry",
    "Manifest",
    "PackRequest",
    "Packed",
    "TransferHandle",
    "TransferStrategy",
    "get_strategy",
    "register_strategy",
    "select_strategy",
    "strategies",
]
