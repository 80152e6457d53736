"""The node storage filesystem against the contract of a pyarrow filesystem: every
``FileSystemHandler`` method, with the errors pyarrow's own ``LocalFileSystem`` raises.

Each contract test runs twice: on ``LocalFileSystem`` (the reference: what a pyarrow
user expects) and on ``storage_filesystem`` of node ``node_a`` used from the driver,
so that every call crosses nodes. File bodies span several chunks.
"""

from __future__ import annotations

import errno
import gc
import io
import os
import pickle
import posixpath
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import ray
from checkpoints import MiB, digest_tree, kill_and_wait, make_checkpoint, on
from conftest import node_ids

from air_transfer import (
    ChecksumError,
    ChunkedCheckpoint,
    SourceChangedError,
    TransferConfig,
    storage_filesystem,
)
from air_transfer.cluster.nodes import node_agent
from air_transfer.core.direct_io import MIN_DIRECT_FILE_BYTES
from air_transfer.core.manifest import chunk_checksum
from air_transfer.storage.client.handler import NodeStorageHandler
from air_transfer.storage.client.uploads import ChunkWriter
from air_transfer.storage.server.metadata import STAGING_MARK

pytestmark = pytest.mark.usefixtures("cluster")
CONFIG = TransferConfig(chunk_bytes=MiB, window=3)
BODY = os.urandom(3 * MiB + 12345)  # four chunks, the last one partial


@pytest.fixture(params=["local", "node-storage", "node-storage-here"])
def fs(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[pafs.FileSystem, str]:
    """A filesystem and a fresh base directory on it holding ``dir/sub``, ``dir/a``
    (3 bytes) and ``big`` (``BODY``). ``node-storage`` is on node_a, used from the
    driver (every call crosses nodes); ``node-storage-here`` is on the driver's own
    node, where files are read natively and written straight into staging."""
    base = tmp_path / "base"
    (base / "dir" / "sub").mkdir(parents=True)
    (base / "dir" / "a").write_bytes(b"abc")
    (base / "big").write_bytes(BODY)
    if request.param == "local":
        return pafs.LocalFileSystem(), str(base)
    node = "node_a" if request.param == "node-storage" else "head"
    return storage_filesystem(node_ids()[node], CONFIG, root=str(tmp_path)), str(base)


def raises(kind: type[BaseException], op: Callable[[], Any]) -> BaseException:
    with pytest.raises(kind) as info:
        op()
    return info.value


def read(f: pafs.FileSystem, path: str) -> bytes:
    with f.open_input_stream(path) as s:
        return s.read()


# -- info and listings --------------------------------------------------------------
def test_file_info(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    big, d, missing = f.get_file_info([f"{base}/big", f"{base}/dir", f"{base}/nope"])
    assert (big.type, big.size, big.path) == (pafs.FileType.File, len(BODY), f"{base}/big")
    assert big.mtime_ns == os.stat(f"{base}/big").st_mtime_ns
    assert (d.type, missing.type) == (pafs.FileType.Directory, pafs.FileType.NotFound)
    assert f.get_file_info(f"{base}/big/x").type == pafs.FileType.NotFound


def test_selectors(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs

    def listing(sub: str, recursive: bool) -> dict[str, Any]:
        infos = f.get_file_info(pafs.FileSelector(f"{base}{sub}", recursive=recursive))
        return {i.path: (i.type, i.size) for i in infos}

    file_, dir_ = pafs.FileType.File, pafs.FileType.Directory
    assert listing("", False) == {f"{base}/big": (file_, len(BODY)), f"{base}/dir": (dir_, None)}
    assert listing("", True) == {
        f"{base}/big": (file_, len(BODY)),
        f"{base}/dir": (dir_, None),
        f"{base}/dir/a": (file_, 3),
        f"{base}/dir/sub": (dir_, None),
    }
    assert listing("/dir/", False) == {f"{base}/dir/a": (file_, 3), f"{base}/dir/sub": (dir_, None)}
    missing = pafs.FileSelector(f"{base}/nope", allow_not_found=True)
    assert f.get_file_info(missing) == []
    raises(FileNotFoundError, lambda: f.get_file_info(pafs.FileSelector(f"{base}/nope")))
    raises(NotADirectoryError, lambda: f.get_file_info(pafs.FileSelector(f"{base}/big")))


# -- directories --------------------------------------------------------------------
def test_create_dir(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    f.create_dir(f"{base}/new/deep/er")
    f.create_dir(f"{base}/dir", recursive=False)  # exists: fine
    f.create_dir(f"{base}/new/one", recursive=False)
    assert os.path.isdir(f"{base}/new/deep/er") and os.path.isdir(f"{base}/new/one")
    raises(FileNotFoundError, lambda: f.create_dir(f"{base}/x/y", recursive=False))
    raises(FileExistsError, lambda: f.create_dir(f"{base}/big"))
    raises(NotADirectoryError, lambda: f.create_dir(f"{base}/big/x"))


def test_delete_dir(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    f.delete_dir(f"{base}/dir")
    assert not os.path.exists(f"{base}/dir")
    raises(FileNotFoundError, lambda: f.delete_dir(f"{base}/dir"))
    raises(OSError, lambda: f.delete_dir(f"{base}/big"))
    assert os.path.isfile(f"{base}/big")


def test_delete_dir_contents(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    f.delete_dir_contents(f"{base}/dir")
    assert os.listdir(f"{base}/dir") == []
    f.delete_dir_contents(f"{base}/nope", missing_dir_ok=True)
    raises(FileNotFoundError, lambda: f.delete_dir_contents(f"{base}/nope"))
    raises(OSError, lambda: f.delete_dir_contents(f"{base}/big"))
    assert os.path.isfile(f"{base}/big")


def test_delete_file(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    f.delete_file(f"{base}/dir/a")
    assert not os.path.exists(f"{base}/dir/a")
    raises(FileNotFoundError, lambda: f.delete_file(f"{base}/dir/a"))
    raises(IsADirectoryError, lambda: f.delete_file(f"{base}/dir"))


# -- moves and copies ---------------------------------------------------------------
def test_move(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    f.move(f"{base}/big", f"{base}/dir/big2")
    assert read(f, f"{base}/dir/big2") == BODY and not os.path.exists(f"{base}/big")
    f.move(f"{base}/dir/a", f"{base}/dir/big2")  # replaces a file
    assert read(f, f"{base}/dir/big2") == b"abc"
    f.move(f"{base}/dir/sub", f"{base}/moved")
    assert os.path.isdir(f"{base}/moved")
    raises(FileNotFoundError, lambda: f.move(f"{base}/nope", f"{base}/x"))
    raises(IsADirectoryError, lambda: f.move(f"{base}/dir/big2", f"{base}/moved"))
    raises(NotADirectoryError, lambda: f.move(f"{base}/moved", f"{base}/dir/big2"))
    raises(OSError, lambda: f.move(f"{base}/moved", f"{base}/dir"))  # not empty


def test_copy_file(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    f.copy_file(f"{base}/big", f"{base}/dir/copy")
    f.copy_file(f"{base}/dir/a", f"{base}/big")  # replaces
    assert read(f, f"{base}/dir/copy") == BODY and read(f, f"{base}/big") == b"abc"
    raises(FileNotFoundError, lambda: f.copy_file(f"{base}/nope", f"{base}/x"))
    raises(OSError, lambda: f.copy_file(f"{base}/dir", f"{base}/x"))
    raises(IsADirectoryError, lambda: f.copy_file(f"{base}/big", f"{base}/dir"))


# -- file bodies --------------------------------------------------------------------
def test_output_stream(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    with f.open_output_stream(f"{base}/dir/out") as s:
        for piece in (BODY[:10], BODY[10 : 2 * MiB + 7], BODY[2 * MiB + 7 :]):
            s.write(piece)
        assert s.tell() == len(BODY)
    assert Path(f"{base}/dir/out").read_bytes() == BODY
    with f.open_output_stream(f"{base}/dir/out") as s:  # truncates
        s.write(b"xy")
    with f.open_output_stream(f"{base}/empty"):
        pass
    assert Path(f"{base}/dir/out").read_bytes() == b"xy"
    assert Path(f"{base}/empty").read_bytes() == b""
    raises(IsADirectoryError, lambda: f.open_output_stream(f"{base}/dir"))
    raises(FileNotFoundError, lambda: f.open_output_stream(f"{base}/nope/x"))
    raises(NotADirectoryError, lambda: f.open_output_stream(f"{base}/big/x"))
    assert sorted(os.listdir(f"{base}/dir")) == ["a", "out", "sub"]  # no staging left


def test_append_stream(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    with f.open_append_stream(f"{base}/big") as s:
        s.write(BODY)
    with f.open_append_stream(f"{base}/new") as s:
        s.write(b"first")
    assert Path(f"{base}/big").read_bytes() == BODY + BODY
    assert Path(f"{base}/new").read_bytes() == b"first"
    raises(IsADirectoryError, lambda: f.open_append_stream(f"{base}/dir"))


def test_input_streams(fs: tuple[pafs.FileSystem, str]) -> None:
    f, base = fs
    assert read(f, f"{base}/big") == BODY and read(f, f"{base}/dir/a") == b"abc"
    with f.open_input_stream(f"{base}/big") as s:
        pieces = iter(lambda: s.read(700_001), b"")
        assert b"".join(pieces) == BODY
    with f.open_input_file(f"{base}/big") as r:
        assert r.size() == len(BODY)
        r.seek(len(BODY) - 5)
        assert r.read() == BODY[-5:]
        r.seek(MiB - 3)  # across a chunk boundary, backwards
        assert r.read(6) == BODY[MiB - 3 : MiB + 3] and r.tell() == MiB + 3
        assert r.read_at(4, 2 * MiB) == BODY[2 * MiB : 2 * MiB + 4]
    raises(FileNotFoundError, lambda: f.open_input_stream(f"{base}/nope"))
    raises(FileNotFoundError, lambda: f.open_input_file(f"{base}/nope"))
    raises(OSError, lambda: f.open_input_stream(f"{base}/dir"))


def test_copy_files_round_trip(fs: tuple[pafs.FileSystem, str], tmp_path: Path) -> None:
    """What Ray Train does with a storage filesystem: a tree in, and out again."""
    f, base = fs
    src = make_checkpoint(tmp_path / "src", 2 * MiB + 1)
    pafs.copy_files(str(src), f"{base}/ckpt", destination_filesystem=f, chunk_size=3 * MiB)
    pafs.copy_files(f"{base}/ckpt", str(tmp_path / "out"), source_filesystem=f)
    assert digest_tree(tmp_path / "out") == digest_tree(src) == digest_tree(f"{base}/ckpt")


# -- node storage only --------------------------------------------------------------
@pytest.fixture
def node_fs(tmp_path: Path) -> tuple[pafs.FileSystem, Path]:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"inside")
    (tmp_path / "secret").write_bytes(b"outside")
    (root / "link").symlink_to(tmp_path)
    return storage_filesystem(node_ids()["node_a"], CONFIG, root=str(root)), root


def test_paths_escaping_the_root_are_refused(node_fs: tuple[pafs.FileSystem, Path]) -> None:
    f, root = node_fs
    outside = str(root.parent / "secret")
    for path in (outside, f"{root}/../secret", f"{root}/link/secret", "../secret"):
        for op in (
            lambda p: f.get_file_info(p),
            lambda p: f.get_file_info(pafs.FileSelector(p)),
            lambda p: f.open_input_stream(p),
            lambda p: f.open_output_stream(p),
            lambda p: f.delete_file(p),
            lambda p: f.copy_file(f"{root}/d/f", p),
            lambda p: f.move(p, f"{root}/d/g"),
        ):
            err = raises(PermissionError, lambda: op(path))  # noqa: B023
            assert "outside the storage root" in str(err)
    raises(PermissionError, lambda: f.delete_dir(str(root)))
    assert (root.parent / "secret").read_bytes() == b"outside"
    # Relative paths are taken under the root; the root's own contents may go, but
    # never those of "/".
    assert read(f, "d/f") == b"inside"
    f.delete_dir_contents("/", accept_root_dir=True)
    assert os.listdir(root) == [] and (root.parent / "secret").exists()
    whole_disk = storage_filesystem(node_ids()["node_a"])
    raises(PermissionError, lambda: whole_disk.delete_dir_contents("/", accept_root_dir=True))
    raises(PermissionError, lambda: whole_disk.delete_dir("/"))


@ray.remote
def use_remotely(f: pafs.FileSystem, path: str, expected: pafs.FileSystem) -> tuple[bool, bytes]:
    return f == expected, read(f, path)


def test_pickles_and_compares_equal_to_its_copies(node_fs: tuple[pafs.FileSystem, Path]) -> None:
    f, root = node_fs
    ids = node_ids()
    copy = pickle.loads(pickle.dumps(f))
    assert copy == f and copy.handler == f.handler and hash(copy.handler) == hash(f.handler)
    assert f != storage_filesystem(ids["node_b"], CONFIG, root=str(root))
    assert f != storage_filesystem(ids["node_a"], CONFIG, root=str(root / "d"))
    assert f != pafs.LocalFileSystem()
    same, body = ray.get(use_remotely.options(**on("node_b")).remote(f, f"{root}/d/f", f))
    assert same and body == b"inside"
    # Made before it knows its node: the node of the process that ships it.
    unresolved = pafs.PyFileSystem(NodeStorageHandler(None, str(root)))
    assert pickle.loads(pickle.dumps(unresolved)).handler.node_id == ids["head"]
    raises(ValueError, lambda: storage_filesystem("ab" * 28))
    raises(ValueError, lambda: storage_filesystem(root="relative"))


def test_an_upload_with_an_altered_chunk_is_not_stored(
    node_fs: tuple[pafs.FileSystem, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent refuses the second chunk; the chunks after it are written, so the
    staging file has the full size: only the writer's memory of the failure keeps
    a file with a hole from being committed."""
    import air_transfer.storage.client.uploads

    sent = []

    def checksum_altered_once(chunk: Any) -> str:
        sent.append(len(sent))
        return "0" * 32 if len(sent) == 2 else chunk_checksum(chunk)

    uploads = air_transfer.storage.client.uploads
    monkeypatch.setattr(uploads, "chunk_checksum", checksum_altered_once)
    f, root = node_fs
    (root / "d" / "f").write_bytes(b"old")
    altered = pytest.raises(ChecksumError, match="arrived altered")
    with altered, f.open_output_stream(f"{root}/d/f") as s:
        s.write(BODY * 2)  # eight chunks, more than the window
    assert os.listdir(root / "d") == ["f"] and (root / "d" / "f").read_bytes() == b"old"


@pytest.mark.parametrize("direct_io", [True, False])
def test_large_chunks_are_stored_exactly_with_or_without_direct_io(
    tmp_path: Path, direct_io: bool
) -> None:
    """Chunks large enough for the agent's ``O_DIRECT`` writes, and an unaligned tail
    that goes through the page cache: the stored file is the bytes written."""
    config = TransferConfig(chunk_bytes=MIN_DIRECT_FILE_BYTES, window=2, direct_io=direct_io)
    f = storage_filesystem(node_ids()["node_a"], config, root=str(tmp_path))
    body = os.urandom(2 * MIN_DIRECT_FILE_BYTES + 4097)
    with f.open_output_stream(f"{tmp_path}/model.bin") as s:
        s.write(body[:5])
        s.write(body[5:])
    assert (tmp_path / "model.bin").read_bytes() == body
    assert read(f, f"{tmp_path}/model.bin") == body
    assert os.listdir(tmp_path) == ["model.bin"]  # no staging file left


def test_a_file_that_changed_size_while_read_is_an_error(
    node_fs: tuple[pafs.FileSystem, Path],
) -> None:
    f, root = node_fs
    (root / "big").write_bytes(BODY)
    with f.open_input_stream(f"{root}/big") as s:
        os.truncate(root / "big", MiB)  # after the open, before the bytes are read
        changed = rf"changed while being read: {len(BODY)} bytes when opened, {MiB} now"
        with pytest.raises(SourceChangedError, match=changed):
            s.read()


def test_a_lost_agent_is_a_connection_error_then_replaced(
    node_fs: tuple[pafs.FileSystem, Path],
) -> None:
    f, _ = node_fs
    assert read(f, "d/f") == b"inside"
    kill_and_wait(node_agent(node_ids()["node_a"]))
    err = raises(ConnectionError, lambda: f.get_file_info("d/f"))
    assert node_ids()["node_a"] in str(err)
    assert read(f, "d/f") == b"inside"  # the next call starts a new agent


@pytest.mark.parametrize("storage", ["node-storage-here", "node-storage-elsewhere", "local"])
def test_an_agent_stores_a_transferred_checkpoint(tmp_path: Path, storage: str) -> None:
    """What ``checkpoint_upload_fn`` asks of the agent of node a: on its own disk via
    the verified writer, else through any pyarrow filesystem (here node b's storage)."""
    src = make_checkpoint(tmp_path / "src", 2 * MiB + 3)
    handle = ChunkedCheckpoint.from_directory(src).pack(CONFIG)
    ids = node_ids()
    target = {
        "node-storage-here": lambda: storage_filesystem(ids["node_a"], CONFIG),
        "node-storage-elsewhere": lambda: storage_filesystem(ids["node_b"], CONFIG),
        "local": pafs.LocalFileSystem,
    }[storage]()
    dest = str(tmp_path / "exp" / "checkpoint_0")
    ray.get(node_agent(ids["node_a"]).store_checkpoint.remote(handle, target, dest))
    assert digest_tree(dest) == digest_tree(src)


def rss_anon(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no RssAnon in /proc/{pid}/status")


@ray.remote(num_cpus=0)
def write_then_read(f: pafs.FileSystem, src: str, dest: str, agent_pid: int) -> dict[str, int]:
    """Upload ``src`` to ``dest`` on ``f`` and read it back, sampling the private memory
    (not RSS: mapped object-store pages count there) of this process and the agent."""
    import hashlib
    import threading

    start = {"self": rss_anon(), "agent": rss_anon(agent_pid)}
    peak = dict(start)
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            for who, pid in (("self", "self"), ("agent", agent_pid)):
                peak[who] = max(peak[who], rss_anon(pid))
            done.wait(0.002)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        with open(src, "rb") as i, f.open_output_stream(dest) as o:
            while block := i.read(4 * MiB):
                o.write(block)
        h = hashlib.sha256()
        with f.open_input_stream(dest) as i:
            while block := i.read(4 * MiB):
                h.update(block)
    finally:
        done.set()
        sampler.join()
    with open(src, "rb") as i:
        same = h.digest() == hashlib.file_digest(i, "sha256").digest()
    return {"same": same, **{k: peak[k] - start[k] for k in peak}}


def test_memory_stays_within_a_few_chunks_on_both_ends(tmp_path: Path) -> None:
    size, config = 160 * MiB, TransferConfig(chunk_bytes=2 * MiB, window=4)
    bound = 4 * config.chunk_bytes + 48 * MiB
    src = tmp_path / "src.bin"
    with open(src, "wb") as out:
        for _ in range(size // (16 * MiB)):
            out.write(os.urandom(16 * MiB))
    ids = node_ids()
    f = storage_filesystem(ids["node_a"], config, root=str(tmp_path))
    agent_pid = ray.get(node_agent(ids["node_a"]).pid.remote())
    growth = ray.get(
        write_then_read.options(**on("node_b")).remote(
            f, str(src), str(tmp_path / "dest.bin"), agent_pid
        )
    )
    assert growth["same"] and (tmp_path / "dest.bin").stat().st_size == size
    assert growth["self"] < bound, f"the client grew {growth['self'] / MiB:.0f} MiB"
    assert growth["agent"] < bound, f"the agent grew {growth['agent'] / MiB:.0f} MiB"


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
    that kept e's traceback, and the ChunkWriter in its frames, alive until the
    cyclic collector ran, and the upload's staging file with it."""
    import air_transfer.storage.client.uploads

    f, root = node_fs
    handler = f.handler
    local = f"{root}/d/out"
    staging, start, expect = handler.call_agent("fs_open_write", local, False)
    writer = ChunkWriter(handler.link, local, staging, start, expect)
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
    agent, r = node_agent(node_ids()["node_a"]), str(root)
    ok = chunk_checksum(b"")
    staging = ray.get(agent.disk.remote("fs_open_write", r, f"{r}/d/new", False))[0]

    def forms(name: str) -> list[str]:
        return [
            str(outside / name),
            f"{r}/../outside/{name}",
            f"../outside/{name}",
            f"{r}/link/outside/{name}",
        ]

    calls: list[tuple[str, Callable[[str], tuple[Any, ...]]]] = [
        ("fs_info", lambda p: ([p],)),
        ("fs_list", lambda p: (posixpath.dirname(p), True, False)),
        ("fs_create_dir", lambda p: (p + "-dir/x", True)),
        ("fs_delete_dir", lambda p: (posixpath.dirname(p),)),
        ("fs_delete_dir_contents", lambda p: (posixpath.dirname(p), False)),
        ("fs_delete_file", lambda p: (p,)),
        ("fs_move", lambda p: (p, f"{r}/d/moved")),
        ("fs_move", lambda p: (f"{r}/d/f", p)),
        ("fs_copy_file", lambda p: (p, f"{r}/d/copy")),
        ("fs_copy_file", lambda p: (f"{r}/d/f", p)),
        ("fs_open_write", lambda p: (p, True)),
        ("fs_write", lambda p: (posixpath.join(posixpath.dirname(p), staged), 0, b"", ok)),
        (
            "fs_commit",
            lambda p: (f"{r}/d/f", posixpath.join(posixpath.dirname(p), staged), 0, b"", ok, 7),
        ),
        ("fs_commit", lambda p: (p, staging, 0, b"", ok, 0)),
        ("fs_abort", lambda p: (posixpath.join(posixpath.dirname(p), staged),)),
    ]
    for op, args in calls:  # node_fs made root/link -> root.parent
        for path in forms("secret"):
            with pytest.raises(PermissionError):
                ray.get(agent.disk.remote(op, r, *args(path)))
            assert snapshot(outside) == before, f"{op}{args(path)} changed a file outside"
    for path in forms("secret"):
        reads = agent.disk_read.options(num_returns="streaming").remote(r, path, 7, MiB, 0)
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
    here = storage_filesystem(node_ids()["head"], CONFIG, root=str(root))
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


@ray.remote(num_cpus=0)
def read_digest(f: pafs.FileSystem, path: str) -> str:
    import hashlib

    with f.open_input_stream(path) as s:
        return hashlib.sha256(s.read()).hexdigest()


def read_counters(node: str) -> dict[str, int]:
    counters: dict[str, int] = ray.get(node_agent(node_ids()[node]).read_counters.remote())
    return counters


def test_n_readers_on_other_nodes_read_the_file_from_disk_once(tmp_path: Path) -> None:
    """Three readers of one file, on two other nodes, at once: the storage node packs
    each chunk once and serves the same objects to all (the agent's counters)."""
    import hashlib

    body = os.urandom(9 * MiB + 5)
    (tmp_path / "ckpt.bin").write_bytes(body)
    f = storage_filesystem(node_ids()["node_a"], CONFIG, root=str(tmp_path))
    before = read_counters("node_a")
    readers = [
        read_digest.options(**on(node)).remote(f, str(tmp_path / "ckpt.bin"))
        for node in ("head", "node_b", "node_b")
    ]
    assert ray.get(readers) == [hashlib.sha256(body).hexdigest()] * 3
    after = read_counters("node_a")
    assert after["bytes_read"] - before["bytes_read"] == len(body)
    assert after["bytes_served"] - before["bytes_served"] == 3 * len(body)


def test_without_a_cache_budget_every_reader_reads_the_disk(tmp_path: Path) -> None:
    body = os.urandom(5 * MiB)
    (tmp_path / "ckpt.bin").write_bytes(body)
    f = storage_filesystem(node_ids()["node_a"], CONFIG.replace(cache_bytes=0), root=str(tmp_path))
    before = read_counters("node_a")
    for _ in range(2):
        assert read(f, str(tmp_path / "ckpt.bin")) == body
    assert read_counters("node_a")["bytes_read"] - before["bytes_read"] == 2 * len(body)
    assert read_counters("node_a")["bytes_held"] == 0
