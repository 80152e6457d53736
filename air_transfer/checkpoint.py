"""``ChunkedCheckpoint``: a ``ray.train.Checkpoint`` that crosses the Ray object store
as a list of chunks instead of one blob (ray-project/ray#25217).

A ChunkedCheckpoint is either *local* (a directory on some pyarrow filesystem, exactly
like its parent class) or *transferred* (made by ``from_object_ref``: a read-only view
over chunks in the object store, whose ``filesystem`` streams from them). Both
``to_directory`` and ``open`` work the same way on either.
"""

from __future__ import annotations

import io
import os
import posixpath
from typing import Any

import ray
from ray.exceptions import ObjectLostError
from ray.train import Checkpoint

from air_transfer import _ray
from air_transfer.config import TransferConfig
from air_transfer.fs import payload_filesystem
from air_transfer.handle import TransferHandle, lost_error, pack, pack_to_ref
from air_transfer.layout import Source
from air_transfer.manifest import Manifest


class ChunkedCheckpoint(Checkpoint):
    """A Ray Train checkpoint that travels through the object store in chunks.

    ``to_object_ref()`` packs the directory into chunks and returns one small
    ObjectRef; ``from_object_ref()`` anywhere in the cluster gives back a checkpoint
    whose files stream from those chunks with bounded memory. Pickling a transferred
    checkpoint (``ray.put``, a task argument) ships only its manifest and refs.
    """

    _handle: TransferHandle | None = None

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> ChunkedCheckpoint:
        """Wrap any ``ray.train.Checkpoint`` (local, S3, GCS, a custom pyarrow
        filesystem) so it can be packed into chunks."""
        if isinstance(checkpoint, ChunkedCheckpoint):
            return checkpoint
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"expected a ray.train.Checkpoint, got {type(checkpoint).__name__}")
        return cls(checkpoint.path, filesystem=checkpoint.filesystem)

    @classmethod
    def _from_handle(cls, handle: TransferHandle) -> ChunkedCheckpoint:
        ckpt = cls("/", filesystem=payload_filesystem(handle))
        ckpt._handle = handle
        return ckpt

    # -- transfer ----------------------------------------------------------------------
    def to_object_ref(self, config: TransferConfig | None = None) -> ray.ObjectRef:
        """Pack this checkpoint into chunks and return an ObjectRef to its handle.

        The chunks are owned by the calling process (keep it alive, and the ref
        referenced, until every reader is done) or, with ``owner="node"``, by the
        node's long-lived agent. A transferred checkpoint is re-shared
        without repacking unless a ``config`` asks for a different cut.
        """
        if self._reusable(config):
            return ray.put(self._handle)
        return pack_to_ref(Source(self.filesystem, self.path), config)

    def pack(self, config: TransferConfig | None = None) -> TransferHandle:
        """Pack into chunks without wrapping the handle in an ObjectRef."""
        if self._reusable(config):
            assert self._handle is not None
            return self._handle
        if config is not None and config.owner == "node":
            return ray.get(self.to_object_ref(config))
        return pack(Source(self.filesystem, self.path), config)

    def _reusable(self, config: TransferConfig | None) -> bool:
        return self._handle is not None and config in (None, self._handle.config)

    @classmethod
    def from_object_ref(cls, ref: ray.ObjectRef) -> ChunkedCheckpoint:
        """The checkpoint behind ``ref`` (from ``to_object_ref``), readable here."""
        if not isinstance(ref, ray.ObjectRef):
            raise TypeError(f"from_object_ref expects a ray.ObjectRef, got {type(ref).__name__}")
        try:
            handle = ray.get(ref)
        except ObjectLostError as e:
            raise lost_error(None, f"the checkpoint handle {ref.hex()}", e) from e
        if not isinstance(handle, TransferHandle):
            raise TypeError(
                f"ObjectRef {ref.hex()} holds a {type(handle).__name__}, not a checkpoint "
                "made by ChunkedCheckpoint.to_object_ref()"
            )
        return cls._from_handle(handle)

    @property
    def manifest(self) -> Manifest:
        """What this transferred checkpoint contains (paths, sizes, chunk checksums)."""
        if self._handle is None:
            raise ValueError(
                f"checkpoint at {self.path!r} is local and has no manifest until packed; "
                "use checkpoint.pack().manifest or transfer it with to_object_ref()"
            )
        return self._handle.manifest

    # -- reading -----------------------------------------------------------------------
    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write the checkpoint to ``path`` (a fresh temporary directory if None).

        A transferred checkpoint streams its chunks to disk with bounded memory, and
        the target appears only when complete and verified; an existing directory is
        merged into (the merged tree replaces it in one step).
        """
        if self._handle is None:
            return super().to_directory(path)
        target = path if path is not None else _ray.temporary_checkpoint_dir(self)
        return self._handle.write_to(os.path.expanduser(os.fspath(target)))

    def open(self, relpath: str) -> io.BufferedIOBase:
        """Stream one file of the checkpoint (relative POSIX path) without writing a
        directory; only the chunks holding that file are fetched."""
        if self._handle is not None:
            return self._handle.open_file(relpath)
        return self.filesystem.open_input_file(posixpath.join(self.path, relpath))

    # -- identity ----------------------------------------------------------------------
    def __repr__(self) -> str:
        if self._handle is None:
            return f"ChunkedCheckpoint(filesystem={self.filesystem.type_name}, path={self.path})"
        return f"ChunkedCheckpoint({self._handle.describe()})"

    def __getstate__(self) -> dict[str, Any]:
        if self._handle is None:
            return self.__dict__
        # The filesystem view is rebuilt from the handle on arrival.
        return {"_handle": self._handle, "_uuid": _ray.checkpoint_uuid(self)}

    def __setstate__(self, state: dict[str, Any]) -> None:
        handle = state.get("_handle")
        if handle is not None:
            state = {**state, "path": "/", "filesystem": payload_filesystem(handle)}
        self.__dict__.update(state)
