"""Resolve symlinks inside a tree as the kernel would, in time linear in the tree.

A tree is a mapping ``relative POSIX path -> (kind, target)``: the entries of a manifest,
or those of a manifest merged with what already lies on disk under a target directory.
The resolver answers where a link (or any path text) really leads, so that nothing that
leaves the tree, or that the kernel could not follow at all, is ever written.

Why not ``posixpath.normpath``: with ``d/l -> ..``, ``x -> d/l/..`` normalises to ``d``
but the kernel takes ``..`` from the link's target (the root), so ``x`` is the root's
parent. Why not a straightforward recursive resolver: one that re-expands every link it
passes doubles its work per entry on ``l0 -> .``, ``lk -> l(k-1)/l(k-1)`` (22 entries
took seconds, 41 would take days) and recurses as deep as the chain.
Here each link is resolved once, memoised as the node it leads to, with an explicit
stack, so resolving every link costs O(entries + total length of the targets).

Semantics (Linux ``path_lookupat``):

- a link's target is taken from the directory that physically holds the link;
- ``..`` goes to the physical parent of where the walk is, so after a symlink component
  it is the parent of the link's target; ``..`` at the root leaves the tree;
- a lookup follows at most ``MAXSYMLINKS`` (40) links in all, nested ones included; one
  needing more fails with ELOOP, like a loop, and is refused as one;
- a component that is missing (or not a directory) makes the kernel fail the lookup
  (ENOENT/ENOTDIR). Such dangling targets stay allowed; the rest of the text is then
  walked lexically (``missing/..`` is where ``missing`` would be created), so a target
  like ``missing/../..`` from the root is refused: it would leave the tree once
  ``missing`` exists as a directory, and links met after such a component count as
  followed (conservative: refused where the kernel would only say ENOENT today).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from air_transfer.core.names import short
from air_transfer.errors import ManifestError


class LeavesTree(ManifestError):
    """A link (or path) that resolves outside the tree: the one refusal a merge makes
    of links that, like a loop, would otherwise only fail to resolve."""


#: Links the kernel follows in one lookup (``MAXSYMLINKS`` in ``include/linux/namei.h``).
MAXSYMLINKS = 40

#: One entry of a tree: its kind (``"dir"``, ``"file"``, ``"symlink"``; anything else
#: is a leaf like a file) and, for a symlink, its target text.
TreeEntry = tuple[str, "str | None"]

_ROOT = 0
_NO_PARENT = -1

# Names walked below a missing or non-directory component, innermost first: a cons
# list, so that entering and leaving one is O(1) whatever the depth.
_Virtual = tuple[str, "_Virtual | None"]


@dataclass
class _Frame:
    """The walk of one target text (or of the path being looked up, ``link == -1``)."""

    link: int
    parts: list[str]
    index: int
    node: int
    virtual: _Virtual | None
    follows: int  # links followed so far in this walk, its own link included


@dataclass(frozen=True)
class _Place:
    node: int
    virtual: _Virtual | None
    follows: int


class LinkResolver:
    """Where the links of one tree lead, each resolved once and remembered.

    ``tree`` maps every entry's relative POSIX path (plain segments: no empty, ``.``
    or ``..`` one) to ``(kind, target)``; the root is implicit (a ``""`` key is ignored).
    Every parent of an entry must be a ``"dir"`` entry of the tree: a path that
    physically goes through a symlink cannot exist. Methods raise ManifestError naming
    the link (or path), its target and what went wrong: leaving the tree, an absolute
    target, or a loop (including a chain longer than the kernel's 40 links).
    """

    def __init__(self, tree: Mapping[str, TreeEntry]) -> None:
        self._paths: list[str] = [""]
        self._kinds: list[str] = ["dir"]
        self._targets: list[str | None] = [None]
        ids: dict[str, int] = {"": _ROOT}
        for path, (kind, target) in tree.items():
            if path == "":
                continue
            ids[path] = len(self._paths)
            self._paths.append(path)
            self._kinds.append(kind)
            self._targets.append(target)
        self._parents: list[int] = [_NO_PARENT] * len(self._paths)
        self._children: dict[tuple[int, str], int] = {}
        for node in range(1, len(self._paths)):
            path = self._paths[node]
            head, _, name = path.rpartition("/")
            parent = ids.get(head)
            if name in ("", ".", "..") or path.startswith("/"):
                raise ManifestError(f"tree path {path!r} is not a plain relative path")
            if parent is None or self._kinds[parent] != "dir":
                raise ManifestError(
                    f"tree path {path!r} has parent {head!r} that is not a directory of the tree"
                )
            self._parents[node] = parent
            self._children[(parent, name)] = node
        self._ids = ids
        self._resolved: dict[int, _Place] = {}

    # -- public --------------------------------------------------------------------
    def check_all(self) -> None:
        """Resolve every symlink of the tree; ManifestError on the first bad one."""
        for node, kind in enumerate(self._kinds):
            if kind == "symlink":
                self._resolve_link(node)

    def link_target(self, link: str) -> str:
        """The path, relative to the root (``""`` is the root), that symlink ``link``
        leads to. It may name no entry: dangling targets are allowed."""
        node = self._ids.get(link)
        if node is None or self._kinds[node] != "symlink":
            raise KeyError(f"{link!r} is not a symlink of this tree")
        place = self._resolve_link(node)
        return self._location(place.node, place.virtual)

    def resolve(self, text: str, start: str = "") -> str:
        """Where path ``text``, looked up from directory ``start``, leads, following
        every symlink on the way (a final one too, as ``open`` does), relative to the
        root. Where ``lstat`` would look: ``resolve(parent)`` joined with the name."""
        start_node = self._ids.get(start)
        if start_node is None or self._kinds[start_node] != "dir":
            raise KeyError(f"{start!r} is not a directory of this tree")
        if text.startswith("/"):
            raise LeavesTree(f"path {short(text)} is absolute, outside the tree")
        frame = _Frame(-1, _components(text), 0, start_node, None, 0)
        place = self._walk(frame, what=f"path {short(text)}")
        return self._location(place.node, place.virtual)

    # -- the walk ------------------------------------------------------------------
    def _resolve_link(self, node: int) -> _Place:
        place = self._resolved.get(node)
        if place is None:
            frame = self._link_frame(node)
            place = self._walk(frame, what=self._describe(node))
        return place

    def _link_frame(self, node: int) -> _Frame:
        target = self._targets[node]
        if not isinstance(target, str) or not target:
            raise ManifestError(f"{self._describe(node)} has no valid target")
        if target.startswith("/"):
            raise LeavesTree(f"{self._describe(node)} is absolute, outside the checkpoint")
        return _Frame(node, _components(target), 0, self._parents[node], None, 1)

    def _walk(self, top: _Frame, what: str) -> _Place:
        """Run ``top`` to its end, pushing a frame for each link met that is not yet
        resolved; a link met again while its own frame is open is a loop.

        The frame being walked lives in local variables (this loop runs once per
        component of every target: attribute access would double its cost).
        """
        kinds, children, parents, resolved = (
            self._kinds,
            self._children,
            self._parents,
            self._resolved,
        )
        stack: list[_Frame] = []
        open_links = {top.link}
        frame = top
        parts, i, node, follows = top.parts, top.index, top.node, top.follows
        virtual: _Virtual | None = None
        place: _Place | None
        while True:
            if i == len(parts):
                place = _Place(node, virtual, follows)
                if frame.link >= 0:
                    resolved[frame.link] = place
                    open_links.discard(frame.link)
                if not stack:
                    return place
                frame = stack.pop()
                parts, i, follows = frame.parts, frame.index, frame.follows
            else:
                part = parts[i]
                if part == "..":
                    if virtual is not None:
                        virtual = virtual[1]
                    elif node == _ROOT:
                        raise LeavesTree(
                            f"{self._frame_name(frame.link, what)} points outside the "
                            "checkpoint (a '..' above its root)"
                        )
                    else:
                        node = parents[node]
                    i += 1
                    continue
                if virtual is not None or kinds[node] != "dir":
                    virtual = (part, virtual)
                    i += 1
                    continue
                child = children.get((node, part))
                if child is None:
                    virtual = (part, None)
                    i += 1
                    continue
                if kinds[child] != "symlink":
                    node = child
                    i += 1
                    continue
                place = resolved.get(child)
                if place is None:
                    if child in open_links:
                        raise ManifestError(
                            f"{self._describe(child)} is part of a link loop "
                            f"(met again while resolving {what})"
                        )
                    frame.index, frame.node, frame.virtual, frame.follows = (
                        i,
                        node,
                        virtual,
                        follows,
                    )
                    stack.append(frame)
                    open_links.add(child)
                    if len(stack) + (top.link >= 0) > MAXSYMLINKS:
                        # Each open frame is one more link followed by the bottom one.
                        raise ManifestError(self._too_many(top.link, what))
                    frame = self._link_frame(child)
                    parts, i, node, virtual, follows = frame.parts, 0, frame.node, None, 1
                    continue
            # Continue where the link at parts[i] leads.
            node, virtual = place.node, place.virtual
            follows += place.follows
            i += 1
            if follows > MAXSYMLINKS:
                raise ManifestError(self._too_many(frame.link, what))

    # -- messages ------------------------------------------------------------------
    def _describe(self, node: int) -> str:
        return f"symlink {short(self._paths[node])} -> {short(self._targets[node])}"

    def _too_many(self, link: int, what: str) -> str:
        return (
            f"{self._frame_name(link, what)} needs more than {MAXSYMLINKS} symlinks to "
            "resolve (the kernel's limit): the kernel refuses it as a loop (ELOOP)"
        )

    def _frame_name(self, link: int, what: str) -> str:
        return self._describe(link) if link >= 0 else what

    def _location(self, node: int, virtual: _Virtual | None) -> str:
        names: list[str] = []
        while virtual is not None:
            names.append(virtual[0])
            virtual = virtual[1]
        base = self._paths[node]
        tail = "/".join(reversed(names))
        return f"{base}/{tail}" if base and tail else base or tail


def _components(text: str) -> list[str]:
    """The names and ``..`` of a path text; empty and ``.`` segments change nothing."""
    return [part for part in text.split("/") if part and part != "."]


def check_links(tree: Mapping[str, TreeEntry]) -> None:
    """Refuse (ManifestError) a tree with any symlink that leaves it or loops."""
    LinkResolver(tree).check_all()


def escaping_links(links: Mapping[str, str], check: Iterable[str] | None = None) -> list[str]:
    """The symlinks among ``check`` (default: all of ``links``) that lead out of the
    tree: those a merge must refuse. A link that loops, or needs more than
    ``MAXSYMLINKS`` links, leads nowhere (ELOOP) and is not one of them.

    ``links`` maps the relative POSIX path of every symlink of a tree to its target
    text (the merge of a manifest with what is on disk in a target directory); the
    directories that hold them are implied, and any other name a target walks
    through is taken lexically, as where it would be created.
    """
    tree: dict[str, TreeEntry] = {}
    for path in links:
        parts = path.split("/")
        prefix = ""
        for part in parts[:-1]:
            prefix = f"{prefix}/{part}" if prefix else part
            tree.setdefault(prefix, ("dir", None))
    for path, target in links.items():
        tree[path] = ("symlink", target)
    resolver = LinkResolver(tree)
    bad = []
    for path in links if check is None else check:
        try:
            resolver.link_target(path)
        except LeavesTree:
            bad.append(path)
        except ManifestError:  # a loop: ELOOP, nowhere
            continue
    return bad
