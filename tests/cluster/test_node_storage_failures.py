"""Node storage when things go wrong: an upload that does not finish leaves nothing,
the agent confines every path it is given, an agent killed mid-report leaves nothing
listed. Readers sharing the agent's read cache: ``test_node_storage_read_cache``."""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import os
import posixpath
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray

from air_transfer import ChecksumError, ChunkedCheckpoint, storage_filesystem
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import node_agent
from air_transfer.core.checksum import chunk_checksum
from air_transfer.storage.client.upload_copies import Mode, Route, Staged
from air_transfer.storage.client.uploads import NodeUpload
from air_transfer.storage.node_api import (
    ChunkAt,
    Commit,
    NodeCheckpoints,
    NodeFiles,
    NodeMetadata,
    NodeReads,
)
from air_transfer.storage.server.metadata import STAGING_MARK
from tests.support.checkpoints import MiB, kill_and_wait, make_checkpoint, on
from tests.support.cluster import node_ids
from tests.support.gates import Gate, gated
from tests.support.node_storage import BODY, CONFIG

pytestmark = pytest.mark.usefixtures("cluster")


# -- uploads that do not finish leave nothing --------------------------------------
class FailingReads(pafs.FileSystemHandler):
    """Local files whose reads fail after ``after`` bytes, as a source that breaks
    in the middle of ``copy_files`` (a lost disk, a network filesystem)."""

    def __init__(self, after: int) -> None:
        self.after = after

    def get_type_name(self) -> str:
        return "failing-reads"

    def normalize_path(self, path: str) -> str:
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return pafs.LocalFileSystem().get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return pafs.LocalFileSystem().get_file_info(selector)

    def open_input_stream(self, path: str) -> Any:
        after, f = self.after, open(path, "rb")

        class Breaking(io.RawIOBase):
            def readable(self) -> bool:
                return True

            def readinto(self, buffer: Any) -> int:
                if f.tell() >= after:
                    raise OSError(errno.EIO, "the source broke mid-file", path)
                return f.readinto(buffer)

        return pa.PythonFile(io.BufferedReader(Breaking()), mode="r")

    open_input_file = open_input_stream

    def unused(self, *args: Any) -> Any:
        raise NotImplementedError("not needed as a copy_files source")

    create_dir = delete_dir = delete_dir_contents = delete_root_dir_contents = unused
    delete_file = move = copy_file = open_output_stream = open_append_stream = unused


def hidden_left(top: Path) -> list[str]:
    return [p.name for p in top.rglob("*") if ".air-upload-" in p.name]


@pytest.mark.parametrize("breaks", ["reading the source", "writing the destination"])
def test_a_failed_copy_files_leaves_no_staging_file_and_no_partial_file(
    node_fs: tuple[pafs.FileSystem, Path],
    tmp_path: Path,
    breaks: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defects: when writing failed, the staging file (~110 MiB in the report) stayed
    until the garbage collector ran: the writer was caught in a reference cycle. When
    reading the source failed, pyarrow dropped the destination stream unclosed and
    io.IOBase's finalizer closed it, which committed the truncated file. Both are
    checked with the collector off, the exception still held, right after the call.
    (One file at a time: with threads, copy_files returns at the first failure while
    its other files are still being copied, each to finish or fail on its own.)"""
    f, root = node_fs
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):  # longer than the window: a failed chunk surfaces in write()
        (src / name).write_bytes(BODY * 2)
    f.create_dir(f"{root}/dest")  # copy_files makes only the source's subdirectories
    source: pafs.FileSystem = pafs.LocalFileSystem()
    if breaks == "reading the source":
        source = pafs.PyFileSystem(FailingReads(after=2 * MiB))
    else:
        import air_transfer.storage.client.uploads

        sent: list[int] = []

        def second_altered(chunk: Any) -> str:
            sent.append(len(sent))
            return "0" * 32 if len(sent) == 2 else chunk_checksum(chunk)

        monkeypatch.setattr(air_transfer.storage.client.uploads, "chunk_checksum", second_altered)
    gc.disable()
    try:
        with pytest.raises(OSError) as failed:
            pafs.copy_files(
                str(src),
                f"{root}/dest",
                source_filesystem=source,
                destination_filesystem=f,
                use_threads=False,
            )
        assert failed.value is not None  # held: its traceback holds the writer's frames
        assert hidden_left(root) == []
        for landed in (root / "dest").iterdir():  # a file copied whole may be there
            assert landed.read_bytes() == BODY * 2, f"{landed.name} was published truncated"
    finally:
        gc.enable()


def test_a_failed_write_frees_its_writer_without_the_garbage_collector(
    node_fs: tuple[pafs.FileSystem, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: AgentLink re-raised the agent's error (``e.cause``) inside ``except e``,
    so the error's __context__ was e, which holds it as .cause: a reference cycle
    that kept e's traceback, and the NodeUpload in its frames, alive until the
    cyclic collector ran, and the upload's staging file with it."""
    import air_transfer.storage.client.uploads

    f, root = node_fs
    handler = f.handler
    local = f"{root}/d/out"
    staging, start, expect = handler.link.call(NodeFiles.fs_open_write, handler.root, local, False)
    copy = Staged(handler.node_id, handler.link, local, staging, start, expect)
    sent = Mode(Route.SEND, direct_io=handler.config.direct_io)
    writer = NodeUpload(sent, [copy], handler.config, local)
    alive = weakref.ref(writer)
    sent: list[int] = []

    def second_altered(chunk: Any) -> str:
        sent.append(len(sent))
        return "0" * 32 if len(sent) == 2 else chunk_checksum(chunk)

    monkeypatch.setattr(air_transfer.storage.client.uploads, "chunk_checksum", second_altered)
    gc.disable()
    try:
        with pytest.raises(ChecksumError) as failed:
            writer.write(BODY * 2)
        assert hidden_left(root) == []  # removed at once, though `failed` holds the writer
        del writer, failed
        assert alive() is None
    finally:
        gc.enable()


# -- the agent confines every path it is given --------------------------------------
def test_the_agent_refuses_every_path_outside_the_root(
    node_fs: tuple[pafs.FileSystem, Path],
) -> None:
    """Defect: the agent's ``fs_commit``, called directly, renamed or deleted a file
    outside the root (its staging path was not confined). Every operation, called
    on the actor with each of its path arguments outside the root (absolute, with
    "..", relative, through a symlink), is refused, and nothing outside changes."""
    _, root = node_fs
    outside = root.parent / "outside"
    outside.mkdir()
    staged = f".secret{STAGING_MARK}x"
    for name in ("secret", staged):
        (outside / name).write_bytes(b"outside")
    before = snapshot(outside)
    agent, r = AgentClient(node_ids()["node_a"]), str(root)
    ok = chunk_checksum(b"")
    staging = ray.get(agent.call(NodeFiles.fs_open_write, r, f"{r}/d/new", False))[0]

    def forms(name: str) -> list[str]:
        return [
            str(outside / name),
            f"{r}/../outside/{name}",
            f"../outside/{name}",
            f"{r}/link/outside/{name}",
        ]

    calls: list[tuple[Callable[..., Any], Callable[[str], tuple[Any, ...]]]] = [
        (NodeMetadata.fs_info, lambda p: ([p],)),
        (NodeMetadata.fs_list, lambda p: (posixpath.dirname(p), True, False)),
        (NodeMetadata.fs_create_dir, lambda p: (p + "-dir/x", True)),
        (NodeMetadata.fs_delete_dir, lambda p: (posixpath.dirname(p),)),
        (NodeMetadata.fs_delete_dir_contents, lambda p: (posixpath.dirname(p), False)),
        (NodeMetadata.fs_delete_file, lambda p: (p,)),
        (NodeMetadata.fs_move, lambda p: (p, f"{r}/d/moved")),
        (NodeMetadata.fs_move, lambda p: (f"{r}/d/f", p)),
        (NodeFiles.fs_copy_file, lambda p: (p, f"{r}/d/copy")),
        (NodeFiles.fs_copy_file, lambda p: (f"{r}/d/f", p)),
        (NodeFiles.fs_open_write, lambda p: (p, True)),
        (
            NodeFiles.fs_write,
            lambda p: (ChunkAt(posixpath.join(posixpath.dirname(p), staged), 0), b"", ok),
        ),
        (
            NodeFiles.fs_commit,
            lambda p: (
                Commit(f"{r}/d/f", posixpath.join(posixpath.dirname(p), staged), 0, b"", ok, 7),
            ),
        ),
        (NodeFiles.fs_commit, lambda p: (Commit(p, staging, 0, b"", ok, 0),)),
        (NodeFiles.fs_abort, lambda p: (posixpath.join(posixpath.dirname(p), staged),)),
    ]
    for op, args in calls:  # node_fs made root/link -> root.parent
        for path in forms("secret"):
            with pytest.raises(PermissionError):
                ray.get(agent.call(op, r, *args(path)))
            assert snapshot(outside) == before, f"{op}{args(path)} changed a file outside"
    for path in forms("secret"):
        reads = agent.stream(1, NodeReads.disk_read, r, path, 7, MiB, 0)
        with pytest.raises(PermissionError):
            ray.get(next(reads))
    assert (root / "d" / "f").read_bytes() == b"inside"


def snapshot(top: Path) -> list[tuple[str, bytes]]:
    return sorted((str(p.relative_to(top)), p.read_bytes()) for p in top.rglob("*"))


def test_on_the_storage_node_a_failed_copy_leaves_nothing(tmp_path: Path) -> None:
    """The same guarantee for the same-node path (writes straight into staging, no
    agent): pyarrow drops the writer unclosed when its source fails mid-file, and
    the upload is removed at once, never committed truncated."""
    root = tmp_path / "root"
    (root / "dest").mkdir(parents=True)
    src = tmp_path / "src"
    src.mkdir()
    for name in ("a", "b"):
        (src / name).write_bytes(BODY * 2)
    here = storage_filesystem(node=node_ids()["head"], config=CONFIG, root=str(root))
    gc.disable()
    try:
        with pytest.raises(OSError):
            pafs.copy_files(
                str(src),
                f"{root}/dest",
                source_filesystem=pafs.PyFileSystem(FailingReads(after=2 * MiB)),
                destination_filesystem=here,
                use_threads=False,
            )
        assert hidden_left(root) == []
        for landed in (root / "dest").iterdir():
            assert landed.read_bytes() == BODY * 2, f"{landed.name} was published truncated"
    finally:
        gc.enable()


def internal_names(top: Path) -> list[str]:
    return sorted(p.name for p in top.rglob("*") if ".air-" in p.name)


def test_a_storage_agent_killed_mid_report_leaves_nothing_listed_or_on_disk(
    tmp_path: Path,
) -> None:
    """Defect: the storage agent SIGKILLed while it wrote a reported checkpoint left
    its staging directory and lock file (``.checkpoint_*.air-staging-*``) in the
    run's directory for good, and the filesystem listed them. Listings leave them
    out; while the agent lives its staging is left to it, and the first listing
    after its death removes both."""
    src = make_checkpoint(tmp_path / "src", 6 * MiB)
    exp = tmp_path / "exp"
    exp.mkdir()
    ref = ChunkedCheckpoint.from_directory(str(src)).to_object_ref(config=CONFIG)
    gate = Gate.options(**on("head")).remote()
    f = storage_filesystem(node=node_ids()["node_a"], config=CONFIG, root=str(tmp_path))
    agent = node_agent(node_ids()["node_a"])
    pid = ray.get(agent.pid.remote())
    checkpoint = gated(ChunkedCheckpoint.from_object_ref(ref), gate)
    client = AgentClient(node_ids()["node_a"], agent)
    pending = client.call(
        NodeCheckpoints.store_checkpoint, checkpoint, f, str(exp / "checkpoint_000000")
    )
    ray.get(gate.wait_for_arrivals.remote(1))  # the agent is mid-write

    def listed() -> list[str]:
        return [i.path for i in f.get_file_info(pafs.FileSelector(str(exp), recursive=True))]

    staged = internal_names(exp)
    assert len(staged) == 2, staged  # the staging directory and its lock file
    assert listed() == [] and f.get_file_info(str(exp / staged[0])).type == pafs.FileType.NotFound
    assert internal_names(exp) == staged  # the live writer's: left to it
    kill_and_wait(agent, pid)
    gate.open.remote()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(pending)
    with contextlib.suppress(ConnectionError):  # the agent is lost, then replaced
        listed()
    assert listed() == []
    assert os.listdir(exp) == []
