"""Where the symlinks of a tree lead, resolved as the kernel would, in linear time.

Why: a merge joins two trees that are each safe into one that may not be. With
``s -> .`` in the target and ``l -> s/..`` in the checkpoint (or the other way round),
``l`` leads to the target's parent (issue 10, item 3). A lexical ``normpath`` cannot
see that: after following a symlink, ``..`` goes to the parent of the link's
*target*, not of the link. So every path is a node of a tree of names with parent
pointers; following a link jumps to the node its target resolves to, and ``..`` takes
that node's parent. Components that are not in the tree (or not directories) are
taken lexically, which is conservative: ``missing/..`` stays where it started, as it
would once ``missing`` exists.

Each link is resolved once (memoised) with an explicit stack, never recursion: a
chain of 100,000 links, or links whose targets double through each other, cost time
linear in the total length of the paths and targets.

Plain Python: unit-tested without Ray. (The manifest's own check in
``air_transfer.manifest`` asks the same question of one manifest.)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: What a link resolves to when it is not a node: out of the tree, or a link loop
#: (``ELOOP`` from the kernel: it leads nowhere, so it does not escape).
OUTSIDE = -1
LOOP = -2
_ROOT = 0


def escaping_links(links: Mapping[str, str], check: Iterable[str] | None = None) -> list[str]:
    """The symlinks among ``check`` (default: all) that resolve outside the tree.

    ``links`` maps the relative POSIX path of every symlink of the tree to its target
    text (entries that are not links need not be listed). An absolute target, or
    ``..`` at the root, is outside; the root itself (``current -> .``) is inside.
    """
    resolver = _Resolver(links)
    return [p for p in (links if check is None else check) if resolver.resolve(p) == OUTSIDE]


class _Resolver:
    def __init__(self, links: Mapping[str, str]) -> None:
        self._parent: list[int] = [_ROOT]
        self._children: dict[tuple[int, str], int] = {}
        self._target: dict[int, str] = {}
        self._node: dict[str, int] = {}
        for path, text in links.items():
            node = self._intern(path)
            self._node[path] = node
            self._target[node] = text
        self._done: dict[int, int] = {}

    def resolve(self, path: str) -> int:
        """The node the link at ``path`` leads to, or OUTSIDE, or LOOP."""
        return self._resolve(self._node[path])

    def _intern(self, path: str) -> int:
        node = _ROOT
        for name in path.split("/"):
            node = self._child(node, name)
        return node

    def _child(self, node: int, name: str) -> int:
        key = (node, name)
        child = self._children.get(key)
        if child is None:
            child = len(self._parent)
            self._parent.append(node)
            self._children[key] = child
        return child

    def _resolve(self, link: int) -> int:
        done = self._done.get(link)
        if done is not None:
            return done
        stack = [self._frame(link)]
        busy = {link}
        while stack:
            frame = stack[-1]
            result = self._advance(frame, busy, stack)
            if result is None:
                continue  # a link it passes through was pushed: resolve that first
            self._done[frame.link] = result
            busy.discard(frame.link)
            stack.pop()
        return self._done[link]

    def _advance(self, frame: _Frame, busy: set[int], stack: list[_Frame]) -> int | None:
        """Follow ``frame``'s components; its result, or None after pushing a link
        whose resolution it needs (it resumes at that component)."""
        parts = frame.parts
        while frame.index < len(parts):
            name = parts[frame.index]
            if name == "..":
                if frame.node == _ROOT:
                    return OUTSIDE
                frame.node = self._parent[frame.node]
            else:
                nxt = self._child(frame.node, name)
                if nxt in self._target:
                    resolved = self._done.get(nxt)
                    if resolved is None:
                        if nxt in busy:
                            return LOOP
                        busy.add(nxt)
                        stack.append(self._frame(nxt))
                        return None
                    if resolved < 0:
                        return resolved
                    nxt = resolved
                frame.node = nxt
            frame.index += 1
        return frame.node

    def _frame(self, link: int) -> _Frame:
        text = self._target[link]
        if text.startswith("/"):
            return _Frame(link, [".."], _ROOT)  # absolute: outside, whatever follows
        parts = [p for p in text.split("/") if p not in ("", ".")]
        return _Frame(link, parts, self._parent[link])


@dataclass
class _Frame:
    """A link being resolved: its target's components, the next one, where it is."""

    link: int
    parts: list[str]
    node: int
    index: int = 0
