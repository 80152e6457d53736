"""A real local pyarrow filesystem that notes, in order, every file that appears whole
in it (an output stream closed in place, or a file moved into place), so a test can
check the order in which a writer published its files."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs


class RecordingHandler(pafs.FileSystemHandler):  # type: ignore[misc]
    """``LocalFileSystem`` with ``published``: the final paths, in publication order."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.published: list[str] = []
        #: Called with each path published, once it is (a test's next move).
        self.after_publish: Callable[[str], None] | None = None
        self._lock = threading.Lock()

    def _note(self, path: str) -> None:
        with self._lock:
            self.published.append(path)
        if self.after_publish is not None:
            self.after_publish(path)

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def get_type_name(self) -> str:
        return "recording-local"

    def normalize_path(self, path: str) -> str:
        return self.fs.normalize_path(path)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        return self.fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        self.fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        raise PermissionError("not in tests")

    def delete_file(self, path: str) -> None:
        self.fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        self.fs.move(src, dest)
        self._note(dest)

    def copy_file(self, src: str, dest: str) -> None:
        self.fs.copy_file(src, dest)
        self._note(dest)

    def open_input_stream(self, path: str) -> Any:
        return self.fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        return self.fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any = None) -> Any:
        return self.fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any = None) -> Any:
        return self.fs.open_append_stream(path, metadata=metadata)
