"""Which nodes hold a file's copies (``core.spread``): every failure domain before a
second copy in one, each node its fair share when every node writes, and a cluster
without labels as the ring of node ids."""

from __future__ import annotations

from collections import Counter

import pytest

from air_transfer.core.spread import domain_ring, spread

NODES = [f"{i:02x}" * 4 for i in range(6)]


def test_without_labels_the_copies_are_the_next_nodes_by_id() -> None:
    assert domain_ring(NODES, {}) == NODES
    assert spread([NODES[4]], NODES, 3, {}) == [NODES[4], NODES[5], NODES[0]]


def test_the_copies_span_every_domain_before_one_takes_a_second() -> None:
    zones = dict(zip(NODES, "aaabbc", strict=True))
    for writer in NODES:
        held = spread([writer], NODES, 3, zones)
        assert held[0] == writer and len(set(held)) == 3
        assert {zones[n] for n in held} == {"a", "b", "c"}
    four = spread([NODES[0]], NODES, 4, zones)  # three domains: one holds two
    assert Counter(zones[n] for n in four).most_common(1)[0][1] == 2


def test_each_node_receives_its_fair_share_when_every_node_writes() -> None:
    zones = dict(zip(NODES, "aabbcc", strict=True))
    received = Counter(n for w in NODES for n in spread([w], NODES, 2, zones)[1:])
    assert received == Counter({n: 1 for n in NODES})
    for w in NODES:
        second = spread([w], NODES, 2, zones)[1]
        assert zones[second] != zones[w]


def test_a_repair_keeps_the_holders_it_has_and_adds_a_new_domain() -> None:
    zones = dict(zip(NODES, "aabbcc", strict=True))
    kept = [NODES[0], NODES[2]]  # zones a and b
    held = spread(kept, NODES, 3, zones)
    assert held[:2] == kept and zones[held[2]] == "c"


def test_one_domain_alone_still_gets_every_copy() -> None:
    zones = dict.fromkeys(NODES, "only")
    assert spread([NODES[1]], NODES, 2, zones) == [NODES[1], NODES[2]]


def test_too_few_nodes_are_refused_naming_both_counts() -> None:
    with pytest.raises(ValueError, match="3 distinct nodes are needed; 2 live"):
        spread([NODES[0]], NODES[:2], 3, {})
