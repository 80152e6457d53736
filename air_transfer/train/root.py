"""Where node storage keeps its files: the root a ``storage_filesystem()`` gets when
given none, a directory of air-transfer's own, and the roots refused because every
process of the cluster would read and write the storage node's system directories
through its agent. Paths only: nothing is looked up."""

from __future__ import annotations

import os
import posixpath

#: The root of a storage given none: in the home directory of the process that makes
#: it (the driver's), as Ray Train's own default storage is ``~/ray_results``.
DEFAULT_ROOT = "~/air_transfer"
#: The operating system's own trees: a root is never one of them, inside one, or
#: above one, unless asked for (``expose_system_dirs=True``).
SYSTEM_DIRS = (
    "/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/proc",
    "/run", "/sbin", "/sys", "/usr",
)  # fmt: skip
#: Directories holding everybody's files: a root may lie inside one, never be one.
SHARED_DIRS = ("/home", "/media", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var")


def storage_root(root: str | None, expose_system_dirs: bool = False) -> str:
    """``root`` normalized (default: ``DEFAULT_ROOT`` of this process's home);
    ValueError for a relative one, and for one that would expose the system's
    directories (``SYSTEM_DIRS``: ``/`` itself, one of them or a directory in one) or
    a directory shared by all (``SHARED_DIRS``) unless ``expose_system_dirs``."""
    if root is None:
        root = os.path.expanduser(DEFAULT_ROOT)
    if not isinstance(root, str) or not root.startswith("/"):
        raise ValueError(f"the storage root must be an absolute path, got {root!r}")
    root = posixpath.normpath(root).replace("//", "/")
    exposed = [d for d in SYSTEM_DIRS if _within(root, d) or _within(d, root)]
    if root in SHARED_DIRS:
        exposed.append(root)
    if exposed and not expose_system_dirs:
        raise ValueError(
            f"storage root {root!r} would let every process of the Ray cluster read and "
            f"write {', '.join(exposed[:4])}{' ...' if len(exposed) > 4 else ''} on the "
            "storage node through its air-transfer agent: pass a directory of your own "
            f"(root='/data/checkpoints'; default: {DEFAULT_ROOT}), or "
            "expose_system_dirs=True if that is what you mean"
        )
    return root


def _within(path: str, top: str) -> bool:
    """Whether ``path`` is ``top`` or lies under it."""
    return path == top or path.startswith(top.rstrip("/") + "/")
