"""pyarrow filesystem views over a transferred checkpoint.

``PayloadFileSystemHandler`` makes a TransferHandle look like a read-only directory to
anything that speaks ``pyarrow.fs`` (``ray.train.Checkpoint.get_metadata``,
``pyarrow.fs.copy_files``, Arrow datasets): listings come from the manifest, file
bodies stream through the chunk reader. Every method is a thin adapter, as in
pyarrow's own ``FSSpecHandler``.
"""

from __future__ import annotations

import posixpath

import pyarrow as pa
import pyarrow.fs as pafs

from air_transfer.core.entry import Entry
from air_transfer.transfer.handle import TransferHandle

_TYPES = {"dir": pafs.FileType.Directory, "file": pafs.FileType.File}


class PayloadFileSystemHandler(pafs.FileSystemHandler):
    """Read-only ``pyarrow.fs`` handler over one transferred checkpoint; its root
    (``""`` or ``"/"``) is the checkpoint directory."""

    def __init__(self, handle: TransferHandle) -> None:
        self.handle = handle

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, PayloadFileSystemHandler)
            and other.handle.transfer_id == self.handle.transfer_id
        )

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash(self.handle.transfer_id)

    def get_type_name(self) -> str:
        return "air-transfer"

    def normalize_path(self, path: str) -> str:
        return path

    # -- reading -------------------------------------------------------------------
    def _info(self, path: str) -> pafs.FileInfo:
        rel = path.strip("/")
        if not rel:
            return pafs.FileInfo(path, pafs.FileType.Directory)
        if rel not in self.handle.manifest:
            return pafs.FileInfo(path, pafs.FileType.NotFound)
        e = self.handle.manifest.entry(rel)
        # A symlink is reported as what it points to would be (pyarrow has no link
        # type); unresolvable ones as Unknown.
        e = self._resolve(e) or e
        ftype = _TYPES.get(e.kind, pafs.FileType.Unknown)
        size = e.size if e.kind == "file" else None
        return pafs.FileInfo(path, ftype, mtime_ns=e.mtime_ns, size=size)

    def _resolve(self, e: Entry) -> Entry | None:
        for _ in range(40):
            if e.kind != "symlink":
                return e
            rel = posixpath.normpath(posixpath.join(posixpath.dirname(e.path), e.target or ""))
            if rel == ".":
                return Entry("root", "dir")
            if rel not in self.handle.manifest:
                return None
            e = self.handle.manifest.entry(rel)
        return None

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return [self._info(p) for p in paths]

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        base = selector.base_dir
        info = self._info(base)
        if info.type == pafs.FileType.NotFound:
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(f"{base!r} is not in this checkpoint")
        if info.type != pafs.FileType.Directory:
            raise NotADirectoryError(f"{base!r} is not a directory in this checkpoint")
        rel_base = base.strip("/")
        prefix = f"{rel_base}/" if rel_base else ""
        lead = "/" if base.startswith("/") else ""
        infos = []
        for e in self.handle.manifest.entries:
            if not e.path.startswith(prefix):
                continue
            if not selector.recursive and "/" in e.path[len(prefix) :]:
                continue
            infos.append(self._info(lead + e.path))
        return infos

    def _open(self, path: str) -> pa.PythonFile:
        info = self._info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"{path!r} is not in this checkpoint")
        if info.type != pafs.FileType.File:
            raise IsADirectoryError(f"{path!r} is not a file in this checkpoint")
        entry = self._resolve(self.handle.manifest.entry(path.strip("/")))
        assert entry is not None
        return pa.PythonFile(self.handle.open_file(entry.path), mode="r")

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._open(path)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._open(path)

    # -- writing: refused ----------------------------------------------------------
    def _read_only(self, path: str) -> PermissionError:
        return PermissionError(
            f"cannot modify {path!r}: a transferred checkpoint is a read-only view of "
            "objects in the Ray object store; call to_directory() for a writable copy"
        )

    def create_dir(self, path: str, recursive: bool) -> None:
        raise self._read_only(path)

    def delete_dir(self, path: str) -> None:
        raise self._read_only(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        raise self._read_only(path)

    def delete_root_dir_contents(self) -> None:
        raise self._read_only("/")

    def delete_file(self, path: str) -> None:
        raise self._read_only(path)

    def move(self, src: str, dest: str) -> None:
        raise self._read_only(dest)

    def copy_file(self, src: str, dest: str) -> None:
        raise self._read_only(dest)

    def open_output_stream(self, path: str, metadata: object = None) -> pa.NativeFile:
        raise self._read_only(path)

    def open_append_stream(self, path: str, metadata: object = None) -> pa.NativeFile:
        raise self._read_only(path)


def payload_filesystem(handle: TransferHandle) -> pafs.PyFileSystem:
    """A ``pyarrow.fs.PyFileSystem`` whose root is the transferred checkpoint."""
    return pafs.PyFileSystem(PayloadFileSystemHandler(handle))
