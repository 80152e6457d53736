"""Where a command reads or writes, as typed on the command line: node storage, or any
other filesystem. Plain Python (parsing needs no Ray).

Node storage is written ``node://NODE/PATH``: PATH is the absolute path on that node;
NODE is ``head``, a Ray node id (56 hex digits), a node's IP address, or empty
(``node:///PATH``: the command's ``--node``, by default the head node, where a
``ray job submit`` driver keeps a run's storage). Anything else with a scheme
(``s3://``, ``gs://``, ``hdfs://``, ``file://``, or any fsspec protocol) is a URI
``pyarrow.fs.FileSystem.from_uri`` (else fsspec) opens; a plain path is this
machine's disk in ``cp``, and node storage on ``--node`` where a command only works
on node storage (``ls``, ``verify``, ``clean``).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from air_transfer.core.node_names import check_node_name

SCHEME = "node://"
NODE_FORMS = "'head', a Ray node id (56 hex digits, from `ray list nodes`) or a node's IP address"


@dataclass(frozen=True)
class NodePath:
    """A path of node storage: ``node`` as typed (None: the command's default node)
    and the absolute, normalised ``path`` on it."""

    node: str | None
    path: str

    def __str__(self) -> str:
        return f"{SCHEME}{self.node or ''}{self.path}"


@dataclass(frozen=True)
class OtherPath:
    """A path of any other filesystem: a URI with a scheme, or a local path."""

    text: str

    @property
    def is_uri(self) -> bool:
        return "://" in self.text

    def __str__(self) -> str:
        return self.text


def parse_location(text: str) -> NodePath | OtherPath:
    """``text`` as ``cp`` reads it: ``node://...`` is node storage, anything else
    another filesystem."""
    if text.startswith(SCHEME):
        return parse_node_path(text)
    if not text:
        raise ValueError("an empty path")
    return OtherPath(text)


def parse_node_path(text: str) -> NodePath:
    """``text`` as a path of node storage: ``node://NODE/PATH`` or an absolute path
    (on the command's default node)."""
    if not text.startswith(SCHEME):
        if not text.startswith("/"):
            raise ValueError(
                f"{text!r}: give the absolute path on the storage node (or node://NODE/PATH)"
            )
        return NodePath(None, _normal(text))
    rest = text[len(SCHEME) :]
    if rest.startswith("["):  # an IPv6 address: node://[::1]/path
        end = rest.find("]")
        if end < 0:
            raise ValueError(f"{text!r}: an IPv6 address is closed by ']'")
        node, path = rest[1:end], rest[end + 1 :]
    else:
        slash = rest.find("/")
        node, path = (rest, "") if slash < 0 else (rest[:slash], rest[slash:])
    if not path.startswith("/"):
        raise ValueError(f"{text!r}: node storage is node://NODE/ABSOLUTE/PATH")
    return NodePath(check_node_name(node, NODE_FORMS) if node else None, _normal(path))


def _normal(path: str) -> str:
    if "\x00" in path:
        raise ValueError(f"{path!r} contains a NUL byte")
    return "/" + posixpath.normpath(path).lstrip("/")
