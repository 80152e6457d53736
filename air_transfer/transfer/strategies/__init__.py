"""Transfer strategies (what a transfer's payload is): the registry, and the built-ins
registered in this one place."""

from air_transfer.transfer.strategies.base import Layout, Packed, PackRequest, TransferStrategy
from air_transfer.transfer.strategies.chunked import ChunkedStrategy
from air_transfer.transfer.strategies.inline import InlineStrategy
from air_transfer.transfer.strategies.registry import (
    Registrations,
    get_strategy,
    register_strategy,
    registrations,
    select_strategy,
    size_rules,
    strategies,
)
from air_transfer.transfer.strategies.streamed import StreamedStrategy

register_strategy(InlineStrategy)
register_strategy(ChunkedStrategy)
register_strategy(StreamedStrategy)

__all__ = [
    "ChunkedStrategy",
    "InlineStrategy",
    "Layout",
    "PackRequest",
    "Packed",
    "Registrations",
    "StreamedStrategy",
    "TransferStrategy",
    "get_strategy",
    "register_strategy",
    "registrations",
    "select_strategy",
    "size_rules",
    "strategies",
]
