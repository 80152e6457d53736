"""``FileSink``: a chunk stream's bytes written into its files in order, one file
open at a time, large ones around the page cache (``core.direct_io``), each byte fed
to the chunk's hasher as it is written so the writer verifies in the same pass."""

from __future__ import annotations

from collections.abc import Sequence
from typing import BinaryIO

from air_transfer.core.direct_io import DirectFileWriter, Hasher, should_write_direct
from air_transfer.core.entry import Entry
from air_transfer.core.names import under
from air_transfer.errors import error_at


class FileSink:
    """Writes the stream's bytes into files in order; one file open at a time, large
    ones around the page cache if ``direct_io``. ``views_kept``: the views handed to
    ``write`` stay unchanged until the sink is closed (``DirectFileWriter.write``)."""

    def __init__(
        self, root: str, files: Sequence[Entry], direct_io: bool, views_kept: bool = False
    ) -> None:
        self.root, self.files, self.direct_io = root, files, direct_io
        self.views_kept = views_kept
        self.index = -1
        self.path = ""
        self.written = 0
        self.handle: BinaryIO | DirectFileWriter | None = None

    def _advance_to(self, file_index: int) -> None:
        while self.index < file_index:
            self._close()
            self.index += 1
            entry = self.files[self.index]
            self.path, self.written = under(self.root, entry.path), 0
            if should_write_direct(entry.size, self.direct_io):
                self.handle = DirectFileWriter(self.path)
            else:
                self.handle = open(self.path, "wb", buffering=0)

    def _close(self, failed: bool = False) -> None:
        handle, self.handle = self.handle, None
        if isinstance(handle, DirectFileWriter) and failed:
            handle.abort()
        elif handle is not None:
            try:
                handle.close()
            except OSError as e:
                if isinstance(handle, DirectFileWriter):
                    raise  # it names the file and keeps the errno
                raise error_at(e, self.path, f"closing it after {self.written} bytes") from e

    def write(self, file_index: int, view: memoryview, hasher: Hasher | None = None) -> None:
        """Append ``view`` to file ``file_index`` (files before it are finished, empty
        ones made), updating ``hasher`` with its bytes."""
        self._advance_to(file_index)
        if isinstance(self.handle, DirectFileWriter):
            self.handle.write(view, hasher, kept=self.views_kept)
            return
        assert self.handle is not None
        if hasher is not None:
            hasher.update(view)
        while view:
            try:
                written = self.handle.write(view)
            except OSError as e:
                raise error_at(e, self.path, f"writing it after {self.written} bytes") from e
            view = view[written:]
            self.written += written

    def __enter__(self) -> FileSink:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        if exc_type is None:
            self._advance_to(len(self.files) - 1)  # trailing empty files
        self._close(failed=exc_type is not None)
