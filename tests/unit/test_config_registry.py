"""TransferConfig validation, the strategy registry and size-based selection (no Ray)."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from air_transfer import TransferConfig
from air_transfer.config import DEFAULT_INLINE_MAX_BYTES, MiB
from air_transfer.extend import (
    TransferStrategy,
    get_strategy,
    register_strategy,
    select_strategy,
    strategies,
)
from air_transfer.transfer.strategies import (
    ChunkedStrategy,
    InlineStrategy,
    Registrations,
    StreamedStrategy,
    registrations,
    registry,
    size_rules,
)


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
        ({"reuse_chunks": 1, "owner": "node"}, TypeError, "reuse_chunks must be a bool"),
        ({"reuse_chunks": True}, ValueError, r"reuse_chunks=True needs owner='node'.*'caller'"),
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


# -- size rules: user strategies selected by size (no Ray) ------------------------------
class Big(ChunkedStrategy):
    name = "test-big"


class Huge(ChunkedStrategy):
    name = "test-huge"


SMALL_INLINE = TransferConfig(chunk_bytes=MiB, window=4, inline_max_bytes=2 * MiB)


@pytest.mark.usefixtures("registry_restored")
def test_a_size_rule_selects_a_user_strategy_above_its_threshold() -> None:
    """The design card's "selected by size threshold, open to users": a strategy
    registered with ``select_above_bytes`` is picked for checkpoints above it, before
    the built-in rules (even when the store would call for ``streamed``); an explicit
    ``config.strategy`` still wins; below the threshold nothing changes."""
    assert register_strategy(Big, select_above_bytes=100 * MiB) is Big
    assert size_rules == {"test-big": 100 * MiB}
    assert select_strategy(MiB, SMALL_INLINE) == "inline"
    assert select_strategy(100 * MiB, SMALL_INLINE) == "chunked"
    assert select_strategy(100 * MiB + 1, SMALL_INLINE) == "test-big"
    assert select_strategy(10**12, SMALL_INLINE, store_free_bytes=MiB) == "test-big"
    assert select_strategy(10**12, SMALL_INLINE.replace(strategy="chunked")) == "chunked"
    assert select_strategy(90 * MiB, SMALL_INLINE, store_free_bytes=100 * MiB) == "streamed"


@pytest.mark.usefixtures("registry_restored")
def test_the_largest_threshold_below_the_size_wins() -> None:
    register_strategy(Huge, select_above_bytes=10 * 1024 * MiB)
    register_strategy(Big, select_above_bytes=100 * MiB)
    assert select_strategy(101 * MiB, SMALL_INLINE) == "test-big"
    assert select_strategy(10 * 1024 * MiB, SMALL_INLINE) == "test-big"
    assert select_strategy(10 * 1024 * MiB + 1, SMALL_INLINE) == "test-huge"


@pytest.mark.usefixtures("registry_restored")
def test_threshold_zero_takes_every_checkpoint_that_is_not_empty() -> None:
    register_strategy(Big, select_above_bytes=0)
    assert select_strategy(0, SMALL_INLINE) == "inline"
    assert select_strategy(1, SMALL_INLINE) == "test-big"


@pytest.mark.usefixtures("registry_restored")
def test_a_built_in_can_be_given_a_size_rule() -> None:
    """E.g. always stream above 1 GiB, whatever the free store."""
    register_strategy(StreamedStrategy, clobber=True, select_above_bytes=1024 * MiB)
    assert select_strategy(1024 * MiB + 1, SMALL_INLINE, store_free_bytes=10**15) == "streamed"
    assert select_strategy(1024 * MiB, SMALL_INLINE, store_free_bytes=10**15) == "chunked"


@pytest.mark.usefixtures("registry_restored")
def test_a_size_rule_is_never_replaced_silently() -> None:
    """The registration is the class and its rule: the same again is a no-op, a
    changed or dropped rule needs ``clobber=True``, as a changed class does."""
    register_strategy(Big, select_above_bytes=100 * MiB)
    register_strategy(Big, select_above_bytes=100 * MiB)  # no-op
    changed = r"'test-big' is already registered with select_above_bytes=104857600, not "
    with pytest.raises(ValueError, match=changed + r"select_above_bytes=1;.*clobber=True"):
        register_strategy(Big, select_above_bytes=1)
    with pytest.raises(ValueError, match=r"select_above_bytes=104857600, not no size rule"):
        register_strategy(Big)
    assert size_rules == {"test-big": 100 * MiB}
    register_strategy(Big, clobber=True, select_above_bytes=1)
    assert size_rules == {"test-big": 1}
    register_strategy(Big, clobber=True)
    assert "test-big" not in size_rules and strategies["test-big"] is Big
    assert select_strategy(10**12, SMALL_INLINE) == "chunked"


@pytest.mark.usefixtures("registry_restored")
def test_two_rules_may_not_share_a_threshold() -> None:
    register_strategy(Big, select_above_bytes=100 * MiB)
    with pytest.raises(ValueError, match=r"'test-big' is already selected above 104857600"):
        register_strategy(Huge, select_above_bytes=100 * MiB)
    assert "test-huge" not in strategies  # a refused registration changes nothing


@pytest.mark.usefixtures("registry_restored")
@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (-1, ValueError, r"select_above_bytes of 'test-big' must be >= 0, got -1"),
        ("1", TypeError, r"select_above_bytes of 'test-big' must be an int, got '1'"),
        (True, TypeError, r"must be an int, got True"),
        (1.5, TypeError, r"must be an int, got 1.5"),
    ],
)
def test_bad_thresholds_are_refused(value: object, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        register_strategy(Big, select_above_bytes=value)  # type: ignore[arg-type]
    assert "test-big" not in strategies and "test-big" not in size_rules


def test_size_rules_is_a_read_only_view() -> None:
    assert isinstance(size_rules, MappingProxyType)
    with pytest.raises(TypeError):
        size_rules["x"] = 1  # type: ignore[index]


@pytest.mark.usefixtures("registry_restored")
def test_another_processs_registrations_select_in_place_of_this_ones() -> None:
    """What an ``owner="node"`` agent packs with: the caller's registrations (the
    strategy it names, or its size rules and their classes), not the agent's own,
    where a strategy registered only in the caller was unknown or its rule ignored."""
    register_strategy(Big, select_above_bytes=100 * MiB)
    caller = registrations(SMALL_INLINE)
    assert caller == Registrations({"test-big": Big}, {"test-big": 100 * MiB})
    named = registrations(SMALL_INLINE.replace(strategy="test-big"))
    assert named == Registrations({"test-big": Big}, {})
    with pytest.raises(ValueError, match="unknown transfer strategy 'nope'"):
        registrations(SMALL_INLINE.replace(strategy="nope"))
    registry._registry.pop("test-big")  # the agent's process: never registered there
    registry._size_rules.pop("test-big")
    assert select_strategy(200 * MiB, SMALL_INLINE) == "chunked"
    assert select_strategy(200 * MiB, SMALL_INLINE, None, caller) == "test-big"
    assert get_strategy("test-big", caller) is Big
    config = SMALL_INLINE.replace(strategy="test-big")
    assert select_strategy(MiB, config, None, named) == "test-big"
    # A caller without rules replaces the agent's: the built-in choice.
    register_strategy(Huge, select_above_bytes=0)
    assert select_strategy(200 * MiB, SMALL_INLINE, None, Registrations()) == "chunked"
