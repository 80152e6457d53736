"""How a user names a node (``node=``, the CLI's ``node://NODE/...``): ``"head"``, a
Ray node id, or a node's IP address. Plain Python, so that the command line checks
a name before anything imports Ray; ``cluster.nodes`` looks the name up."""

from __future__ import annotations

import ipaddress
import re

#: A Ray node id as text: 28 bytes in hex (``ray.get_runtime_context().get_node_id()``).
NODE_ID = re.compile(r"[0-9a-f]{56}")


def is_ip(text: str) -> bool:
    """Whether ``text`` is an IPv4 or IPv6 address."""
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def is_node_name(text: str) -> bool:
    """Whether ``text`` names a node as a user may: ``"head"``, a node id or an IP."""
    return text == "head" or NODE_ID.fullmatch(text) is not None or is_ip(text)


def check_node_name(node: object, forms: str) -> str:
    """``node`` if it names a node as a user may (``is_node_name``), else ValueError
    saying that a node is one of ``forms`` (worded for where it was given)."""
    if isinstance(node, str) and is_node_name(node):
        return node
    raise ValueError(f"node must be {forms}, got {node!r}")
