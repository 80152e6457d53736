"""TransferConfig validation, the strategy registry and size-based selection (no Ray)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from air_transfer import (
    TransferConfig,
    TransferStrategy,
    get_strategy,
    register_strategy,
    select_strategy,
    strategies,
)
from air_transfer.config import DEFAULT_INLINE_MAX_BYTES, MiB
from air_transfer.strategies import ChunkedStrategy, InlineStrategy


def test_defaults_are_valid_and_frozen() -> None:
    c = TransferConfig()
    assert c.chunk_bytes >= MiB and c.window >= 1 and c.verify and c.strategy is None
    assert c.inline_limit == DEFAULT_INLINE_MAX_BYTES
    with pytest.raises(AttributeError):
        c.window = 3  # type: ignore[misc]
    assert c.replace(window=2).window == 2


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"chunk_bytes": 0}, ValueError, r"chunk_bytes = 0 is outside"),
        ({"chunk_bytes": 3 * 1024**3}, ValueError, "chunk_bytes"),
        ({"chunk_bytes": 1.5}, TypeError, "chunk_bytes must be an int"),
        ({"window": 0}, ValueError, "window = 0"),
        ({"window": True}, TypeError, "window must be an int"),
        ({"inline_max_bytes": -1}, ValueError, "inline_max_bytes"),
        (
            {"chunk_bytes": MiB, "window": 2, "inline_max_bytes": 3 * MiB},
            ValueError,
            r"window \* chunk_bytes = 2097152",
        ),
        ({"strategy": ""}, ValueError, "registered strategy name"),
        ({"verify": "yes"}, TypeError, "verify must be a bool"),
    ],
)
def test_bad_values_fail_at_construction(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        TransferConfig(**kwargs)


def test_inline_default_shrinks_with_a_small_window() -> None:
    c = TransferConfig(chunk_bytes=MiB, window=2)
    assert c.inline_limit == 2 * MiB


def test_selection_by_size_and_explicit_name() -> None:
    c = TransferConfig(chunk_bytes=MiB, window=4, inline_max_bytes=2 * MiB)
    assert select_strategy(0, c) == "inline"
    assert select_strategy(2 * MiB, c) == "inline"
    assert select_strategy(2 * MiB + 1, c) == "chunked"
    assert select_strategy(10**12, c.replace(strategy="inline")) == "inline"
    with pytest.raises(ValueError, match=r"unknown transfer strategy 'nope'.*chunked"):
        select_strategy(1, c.replace(strategy="nope"))
    with pytest.raises(ValueError, match="non-negative"):
        select_strategy(-1, c)


def test_streamed_when_the_checkpoint_would_not_fit_the_free_store() -> None:
    c = TransferConfig(chunk_bytes=MiB, window=4, inline_max_bytes=2 * MiB)
    assert select_strategy(700 * MiB, c, store_free_bytes=1000 * MiB) == "chunked"
    assert select_strategy(900 * MiB, c, store_free_bytes=1000 * MiB) == "streamed"
    assert select_strategy(900 * MiB, c, store_free_bytes=None) == "chunked"  # unknown
    assert select_strategy(MiB, c, store_free_bytes=0) == "inline"
    assert select_strategy(900 * MiB, c.replace(strategy="chunked"), 1000 * MiB) == "chunked"


def test_owner_is_validated() -> None:
    assert TransferConfig(owner="node").owner == "node"
    with pytest.raises(ValueError, match="owner must be one of 'caller', 'node'"):
        TransferConfig(owner="driver")  # type: ignore[arg-type]


def test_registry_is_a_read_only_view_of_the_built_ins() -> None:
    assert isinstance(strategies, MappingProxyType)
    assert strategies["inline"] is InlineStrategy and get_strategy("chunked") is ChunkedStrategy
    with pytest.raises(TypeError):
        strategies["x"] = ChunkedStrategy  # type: ignore[index]


def test_register_refuses_clashes_unless_clobbering() -> None:
    class Impostor(ChunkedStrategy):
        name = "chunked"

    with pytest.raises(ValueError, match=r"'chunked' is already registered.*clobber=True"):
        register_strategy(Impostor)
    assert register_strategy(ChunkedStrategy) is ChunkedStrategy  # same class: a no-op
    try:
        register_strategy(Impostor, clobber=True)
        assert get_strategy("chunked") is Impostor
    finally:
        register_strategy(ChunkedStrategy, clobber=True)


def test_register_refuses_non_strategies() -> None:
    with pytest.raises(TypeError, match="TransferStrategy subclass"):
        register_strategy(object)  # type: ignore[arg-type]

    class Nameless(TransferStrategy):
        def pack(self, source, files, config):  # type: ignore[override]
            raise NotImplementedError

        def iter_chunks(self, payload, manifest, start, stop, config):  # type: ignore[override]
            raise NotImplementedError

    with pytest.raises(TypeError, match="name must be a non-empty str"):
        register_strategy(Nameless)


def test_unknown_strategy_lists_known_ones() -> None:
    with pytest.raises(ValueError, match=r"registered: .*chunked.*inline"):
        get_strategy("zstd")
