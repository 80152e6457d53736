"""The two ways to ask ``core.tree_removal`` to remove a tree: by its path (``rmtree``)
and by its entry in an open parent directory (``remove_tree``), as the tree
removal tests run each of their cases."""

from __future__ import annotations

import os
from pathlib import Path

from air_transfer.core.confine import Where
from air_transfer.core.tree_removal import remove_tree, rmtree

_DIR = os.O_RDONLY | os.O_DIRECTORY


def by_path(path: Path) -> int:
    """The entries ``rmtree`` removed under ``path``, itself included."""
    return rmtree(str(path))


def by_entry(path: Path) -> int:
    """The same through ``remove_tree``, given ``path``'s parent open."""
    parent = os.open(path.parent, _DIR)
    try:
        return remove_tree(Where(parent, path.name, str(path)))
    finally:
        os.close(parent)
