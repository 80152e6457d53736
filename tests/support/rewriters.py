"""Ways a training loop rewrites a checkpoint file while it is packed, and the
test-only ``proven_read._after_span_read`` hook that does it between a span's read and
the fstat after it, so the interleaving is deterministic (in the driver, or installed
in a node agent with ``install_in_agent``); the source the torn-pack tests rewrite,
and reading it in this process."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from air_transfer.config import KiB
from air_transfer.core import proven_read
from air_transfer.core.plan import Span
from air_transfer.core.proven_read import read_chunks
from air_transfer.core.scan import Scan, Source, scan

HOW = ("in-place", "utime-reset", "rename")
#: The chunk size of the torn-pack tests, and the error a rewrite of ``w.bin`` gets.
CHUNK = 4 * KiB
CHANGED = r"w\.bin' changed after the directory was scanned"


def rewrite(path: str, how: str) -> None:
    """Give ``path`` other bytes of the same size: written over in place, the same
    with its mtime put back (``os.utime``), or a new file renamed over it."""
    st = os.stat(path)
    with open(path, "rb") as f:
        new = bytes(b ^ 0xFF for b in f.read())
    if how == "rename":
        with open(path + ".new", "wb") as f:
            f.write(new)
        os.replace(path + ".new", path)
        return
    with open(path, "r+b") as f:
        f.write(new)
    if how == "utime-reset":
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        assert os.stat(path).st_mtime_ns == st.st_mtime_ns


@dataclass
class RewriteOnce:
    """Hook: the first time a span of the file named ``name`` at file offset
    ``offset`` or later has been read, rewrite the file (``how``)."""

    name: str
    how: str = "in-place"
    offset: int = 0
    fired: bool = False

    def __call__(self, where: str, span: Span) -> None:
        # The agent packs chunks on several threads: fire once, whichever comes first.
        with globals().setdefault("_HOOK_LOCK", threading.Lock()):
            if self.fired or os.path.basename(where) != self.name:
                return
            if span.file_offset < self.offset:
                return
            self.fired = True
            rewrite(where, self.how)


def _set_hook(agent: Any, hook: Any) -> None:
    proven_read._after_span_read = hook


def install_in_agent(agent: Any, hook: Any) -> None:
    """Set (or with None, clear) the hook in the process of node agent ``agent``."""
    import ray

    ray.get(agent.__ray_call__.remote(_set_hook, hook))


def make_source(tmp_path: Path) -> Path:
    """Three files; ``w.bin`` spans chunks 1 to 9 and is the one rewritten."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3 * KiB))
    (src / "w.bin").write_bytes(os.urandom(32 * KiB + 5))
    (src / "z.bin").write_bytes(os.urandom(2 * KiB))
    return src


def local_scan(root: Path) -> tuple[Source, Scan]:
    """The local directory ``root`` as a source, and its scan."""
    source = Source(pafs.LocalFileSystem(), str(root))
    return source, scan(source)


def read_all(source: Source, scanned: Scan, chunk_bytes: int = CHUNK) -> bytes:
    """Every chunk of ``scanned``, read (and checked) in this process."""
    return b"".join(
        bytes(view)
        for _, view in read_chunks(
            source,
            scanned.files,
            scanned.stamps,
            chunk_bytes,
            lambda i, n: memoryview(bytearray(n)),
        )
    )
