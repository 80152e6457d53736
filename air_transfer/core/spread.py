"""Which nodes hold the copies of one file: as many failure domains as there are
(a zone, a rack: what a node label says), each node its fair share. Plain Python.

The nodes are laid on a ring that takes one node of each domain in turn (domains in
name order, a domain's nodes in id order), and a file's copies are its first holder
(the writer, or the holders it keeps) and the next nodes after it on that ring in a
domain no copy is in yet; only when every domain holds one does a domain get a
second. When every node writes one file, each then receives one copy, whatever the
domains: the ring gives each node one predecessor. A node whose domain is not known
is a domain of its own, so a cluster without labels is the ring of node ids.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import zip_longest


def domain_of(node: str, domains: Mapping[str, str]) -> str:
    """``node``'s failure domain: its label in ``domains``, else its own."""
    return domains.get(node) or f"node:{node}"


def domain_ring(nodes: Iterable[str], domains: Mapping[str, str]) -> list[str]:
    """``nodes`` in ring order: one of each domain in turn (see the module)."""
    members: dict[str, list[str]] = {}
    for node in sorted(set(nodes)):
        members.setdefault(domain_of(node, domains), []).append(node)
    rounds = zip_longest(*(members[d] for d in sorted(members)))
    return [node for turn in rounds for node in turn if node is not None]


def spread(
    kept: Sequence[str], live: Iterable[str], count: int, domains: Mapping[str, str]
) -> list[str]:
    """``count`` distinct nodes: ``kept`` (in order), then live nodes after
    ``kept[0]`` on the ring, a new domain first. ValueError when fewer than
    ``count`` nodes are there to choose from."""
    ring = domain_ring({*live, *kept}, domains)
    if len(ring) < count:
        raise ValueError(f"{count} distinct nodes are needed; {len(ring)} live")
    at = ring.index(kept[0])
    after = [ring[(at + i) % len(ring)] for i in range(1, len(ring))]
    chosen = list(dict.fromkeys(kept))
    for any_domain in (False, True):  # a domain no copy is in, then any
        for node in after:
            held = {domain_of(n, domains) for n in chosen}
            new = any_domain or domain_of(node, domains) not in held
            if len(chosen) < count and node not in chosen and new:
                chosen.append(node)
    return chosen
