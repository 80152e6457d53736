"""What the incremental node-storage tests share: checkpoint directories of
same-size files changed in known ways, the sender's description of one taken as
its node's agent takes it (proven reads, a checksum per per-file chunk), a store of
one through ``IncrementalStore`` on this machine, and on the mock cluster, reports
into node storage on ``node_a`` and its agent's counters."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.fs as pafs
import ray

from air_transfer import TransferConfig, node_agent, storage_filesystem
from air_transfer.core.checksum import chunk_checksum
from air_transfer.core.file_chunks import ChunkedFiles, file_chunk_plans
from air_transfer.core.manifest import Manifest
from air_transfer.core.proven_read import fill_chunk
from air_transfer.core.scan import Source, scan
from air_transfer.storage.node_api import NodeCheckpoints, SenderOffer
from air_transfer.storage.server.incremental import IncrementalStore
from air_transfer.storage.server.senders import local_chunks
from tests.support.cluster import node_ids

CHUNK = 64 * 1024
FILES = 10
PER_FILE = 4  # chunks per file: 10 files of 256 KiB, 2.5 MiB in all
FILE_BYTES = PER_FILE * CHUNK
TOTAL = FILES * FILE_BYTES


def make_files(directory: Path, names: list[str] | None = None) -> Path:
    """``FILES`` random files of ``FILE_BYTES`` (``f0``..), one in a subdirectory."""
    (directory / "sub").mkdir(parents=True, exist_ok=True)
    for name in names or [f"f{i}" if i else "sub/f0" for i in range(FILES)]:
        (directory / name).write_bytes(os.urandom(FILE_BYTES))
    (directory / "empty").write_bytes(b"")
    return directory


def rewrite_chunk(path: Path, chunk: int) -> None:
    """Change chunk ``chunk`` of ``path`` in place (same size)."""
    with open(path, "r+b") as f:
        f.seek(chunk * CHUNK)
        f.write(os.urandom(CHUNK))


def describe(directory: Path, chunk_bytes: int = CHUNK) -> tuple[Source, ChunkedFiles]:
    """``directory`` as its sender describes it before sending anything."""
    source = Source(pafs.LocalFileSystem(), str(directory))
    scanned = scan(source)
    sums = []
    for plan in file_chunk_plans(scanned.files, scanned.stamps, chunk_bytes):
        view = memoryview(np.empty(plan.length, dtype=np.uint8))
        fill_chunk(source, plan, view)
        sums.append(chunk_checksum(view))
    manifest = Manifest(scanned.entries, chunk_bytes, None)
    return source, ChunkedFiles(manifest, scanned.stamps, tuple(sums))


def store(
    incremental: IncrementalStore, root: Path, target: Path, directory: Path
) -> dict[str, int]:
    """Store ``directory`` at ``target`` under ``root`` from this node's disk."""
    source, files = describe(directory)
    return incremental.store(
        str(root), str(target), files, lambda plans: local_chunks(source, plans)
    )


def inodes(*trees: Path) -> dict[int, int]:
    """inode -> bytes on disk, over every file of ``trees`` (each inode once)."""
    found: dict[int, int] = {}
    for tree in trees:
        for path in tree.rglob("*"):
            st = path.lstat()
            if path.is_file():
                found[st.st_ino] = st.st_blocks * 512
    return found


INCREMENTAL_CONFIG = TransferConfig(chunk_bytes=CHUNK, window=2, incremental=True)


@ray.remote(num_cpus=0, max_retries=0)
def report_to(src: str, root: str, dest: str, worker: str = "") -> None:
    """What Ray Train's report does on a worker (``upload_directory``), into node
    storage on ``node_a`` under ``root``, incremental."""
    from ray.train import Checkpoint

    from air_transfer.train.hooks import upload_directory

    fs = storage_filesystem(node=node_ids()["node_a"], config=INCREMENTAL_CONFIG, root=root)
    upload_directory(fs, dest, Checkpoint(src), worker)


@ray.remote(num_cpus=0, max_retries=0)
def report_changed_meanwhile(src: str, root: str, dest: str) -> tuple[str, str]:
    """A report whose file ``f3`` changes after its checksums were taken; what the
    worker got (the class and message of the error)."""
    from air_transfer.storage.client.incremental import chunked_files
    from air_transfer.storage.client.streams import AgentLink

    link = AgentLink(node_ids()["node_a"], root, INCREMENTAL_CONFIG)
    described = chunked_files(src, CHUNK)
    assert described is not None
    source, files = described
    rewrite_chunk(Path(src) / "f3", 0)
    node = ray.get_runtime_context().get_node_id()
    try:
        offer = SenderOffer(source, node, files)
        link.call(NodeCheckpoints.store_incremental, None, root, dest, offer, INCREMENTAL_CONFIG)
    except Exception as e:
        return type(e).__name__, str(e)
    return "no error", ""


def storage_counters() -> dict[str, int]:
    found: dict[str, int] = ray.get(node_agent(node_ids()["node_a"]).incremental_counters.remote())
    return found


def storage_delta(before: dict[str, int]) -> dict[str, int]:
    return {k: v - before[k] for k, v in storage_counters().items()}


@ray.remote(num_cpus=0, max_retries=0)
def report_outcome(src: str, root: str, dest: str) -> tuple[str, str, str]:
    """``report_to``'s report, returning the class, module and message of what it
    raised (``("no error", "", "")`` if nothing)."""
    from ray.train import Checkpoint

    from air_transfer.train.hooks import upload_directory

    fs = storage_filesystem(node=node_ids()["node_a"], config=INCREMENTAL_CONFIG, root=root)
    try:
        upload_directory(fs, dest, Checkpoint(src))
    except Exception as e:
        return type(e).__name__, type(e).__module__, str(e)
    return "no error", "", ""


@dataclasses.dataclass
class HoldAtSpan:
    """A packing hook (``proven_read._after_span_read``) for a node agent: once it
    has read ``count`` spans (checksums first, then chunks sent), arrive at
    ``gate`` and wait there until the test opens it."""

    count: int
    gate: Any
    seen: int = 0

    def __call__(self, where: str, span: Any) -> None:
        self.seen += 1
        if self.seen == self.count:
            ray.get(self.gate.arrive_and_wait.remote())
