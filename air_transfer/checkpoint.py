"""``ChunkedCheckpoint``: a ``ray.train.Checkpoint`` that crosses the Ray object store
as a list of chunks instead of one blob (ray-project/ray#25217).

A ChunkedCheckpoint is either *local* (a directory on some pyarrow filesystem, exactly
like its parent class) or *transferred* (a read-only view over chunks in the object
store, whose ``filesystem`` streams from them). Both ``to_directory`` and ``open``
work the same way on either. What ``to_object_ref`` puts in the object store is the
transferred checkpoint itself (pickled as its handle: manifest and refs), so the
value a task receives for the ref, or ``ray.get`` returns, is ready to use.
"""

from __future__ import annotations

import io
import os
import posixpath
from collections.abc import Sequence
from typing import Any

import pyarrow.fs as pafs
import ray
from ray.train import Checkpoint

from air_transfer.cluster import _ray
from air_transfer.cluster.refs import CheckpointRef, PendingChecksum
from air_transfer.config import TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.core.scan import Source
from air_transfer.observe.progress import progress_enabled
from air_transfer.observe.telemetry import PackWatch, describe
from air_transfer.transfer.fs_view import payload_filesystem
from air_transfer.transfer.future import TransferFuture
from air_transfer.transfer.handle import (
    RAY_ERRORS,
    TransferHandle,
    raise_transfer_error,
)
from air_transfer.transfer.route import start_transfer


class ChunkedCheckpoint(Checkpoint):
    """A Ray Train checkpoint that travels through the object store in chunks.

    ``to_object_ref()`` packs the directory into chunks and returns one small
    ObjectRef; ``from_object_ref()`` anywhere in the cluster gives back a checkpoint
    whose files stream from those chunks with bounded memory. Pickling a transferred
    checkpoint (``ray.put``, a task argument) ships only its manifest and refs.
    """

    _handle: TransferHandle | None = None

    @classmethod
    def from_directory(cls, path: str | os.PathLike[str]) -> ChunkedCheckpoint:
        """A local checkpoint directory, ready to transfer.

        Args:
            path: The directory (made absolute).

        Returns:
            A checkpoint to pack with ``to_object_ref`` or ``to_object_ref_async``.
        """
        return cls(os.path.abspath(os.fspath(path)))

    @classmethod
    def from_checkpoint(cls, checkpoint: Checkpoint) -> ChunkedCheckpoint:
        """Wrap any ``ray.train.Checkpoint`` (local, S3, GCS, a custom pyarrow
        filesystem) so it can be packed into chunks.

        Args:
            checkpoint: The checkpoint (a ``ChunkedCheckpoint`` is returned as it is).

        Returns:
            The same directory on the same filesystem, ready to transfer.

        Raises:
            TypeError: ``checkpoint`` is not a ``ray.train.Checkpoint``.
        """
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
    def to_object_ref_async(self, config: TransferConfig | None = None) -> TransferFuture:
        """Start packing this checkpoint into chunks and return at once, after the
        directory scan and the checks of the input (which raise here); the packing
        tasks are submitted by a background thread, whose errors ``ref`` and the
        future raise.

        ``future.ref`` is usable immediately by any reader anywhere; the future
        completes when the source directory is no longer needed, or raises what
        packing raised (and so does any reader of ``ref``; nothing is published).
        Packing runs in the node's agent, outside this process's Python. The chunks
        are owned as with ``to_object_ref``. A packing still running after a second
        shows a progress bar (``TransferConfig.progress``), drawn by a daemon thread.

        Args:
            config: Chunk size, strategy, owner and the rest (default:
                ``TransferConfig()``).

        Returns:
            The future of the packing: ``future.ref`` at once, ``future.result()``
            (the same ref) once the source directory is free again.

        Raises:
            FileNotFoundError: The directory does not exist.
            SourceChangedError: A file changed while the scan read it.
            ValueError: A setting of ``config`` or the directory's content is refused
                (a link leaving it, a name that cannot be stored); the message names it.
        """
        future, watch = self._submit(config)
        if watch is not None:
            watch.start()
        return future

    def to_object_ref(
        self, config: TransferConfig | None = None
    ) -> ray.ObjectRef[ChunkedCheckpoint]:
        """Pack this checkpoint into chunks and return an ObjectRef to it, once every
        chunk is stored (``to_object_ref_async(config).result()``). While it waits,
        this process stores every other chunk itself beside the node's agent
        (``chunked``); checksums the agent still takes then are waited for by readers.

        The chunks are owned by the calling process (keep it alive, and the ref
        referenced, until every reader is done) or, with ``owner="node"``, by the
        node's long-lived agent. A transferred checkpoint is re-shared
        without repacking unless a ``config`` asks for a different cut.

        Args:
            config: As for ``to_object_ref_async``.

        Returns:
            A ref to this checkpoint, transferred: pass it to any task or actor, or
            to ``from_object_ref``.

        Raises:
            FileNotFoundError: The directory does not exist.
            SourceChangedError: A file changed while it was packed.
            ChecksumError: A chunk read back differs from what was packed.
        """
        future, watch = self._submit(config, background=False)
        if watch is not None:
            watch.run()  # in this thread, which would only wait: the bar ends first
        return future.result()

    def _submit(
        self, config: TransferConfig | None, background: bool = True
    ) -> tuple[TransferFuture, PackWatch | None]:
        """Start packing (submitting the tasks on a background thread if
        ``background``): the future, and the watch that draws its progress bar (None
        when progress is off)."""
        if self._reusable(config):
            return TransferFuture(ray.put(self), None), None
        config = config or TransferConfig()
        source = Source(self.filesystem, self.path)
        ref, submitted = start_transfer(
            source, config, background=background, blocking=not background
        )
        watch = None
        if progress_enabled(config.progress):
            desc = describe(self.path, "to_object_ref")
            watch = PackWatch(desc, submitted, lambda: _packing_chunks(ref))
        return TransferFuture(ref, submitted), watch

    def pack(self, config: TransferConfig | None = None) -> TransferHandle:
        """Pack into chunks and return the complete handle (manifest with every
        checksum, payload) without wrapping it in an ObjectRef.

        Args:
            config: As for ``to_object_ref_async``.

        Returns:
            The ``TransferHandle`` (``air_transfer.extend``), complete.
        """
        if self._reusable(config):
            assert self._handle is not None
            return self._handle.complete()
        ref = self.to_object_ref(config)
        return ChunkedCheckpoint.from_object_ref(ref).handle().complete()

    def _reusable(self, config: TransferConfig | None) -> bool:
        return self._handle is not None and config in (None, self._handle.config)

    @classmethod
    def from_object_ref(cls, ref: object) -> ChunkedCheckpoint:
        """The checkpoint behind ``ref`` (from ``to_object_ref``), readable here.

        ``ref`` may also be what Ray hands a task or actor for such a ref passed as a
        top-level argument (the checkpoint itself), what ``ray.get(ref)`` returned,
        its ``TransferHandle``, or the ``TransferFuture`` of ``to_object_ref_async``:
        whichever a function is handed, the same line works.

        Args:
            ref: What ``to_object_ref`` returned, or any of the above.

        Returns:
            The transferred checkpoint, its files read from the chunks.

        Raises:
            TypeError: ``ref`` holds no transferred checkpoint (the message says what
                it holds and how to transfer it).
            CheckpointLostError: The chunks are gone (their owner died).
        """
        value = ref.ref if isinstance(ref, TransferFuture) else ref
        if isinstance(value, ray.ObjectRef):
            ref = value
            try:
                value = ray.get(ref)
            except RAY_ERRORS as e:
                raise_transfer_error(None, f"the checkpoint handle {ref.hex()}", e)
        if isinstance(value, ChunkedCheckpoint) and value._handle is not None:
            return value
        if isinstance(value, TransferHandle):
            return cls._from_handle(value)
        got = f"ObjectRef {ref.hex()} holds" if isinstance(ref, ray.ObjectRef) else "got"
        if isinstance(value, Checkpoint):
            raise TypeError(
                f"from_object_ref: {got} a {type(value).__name__} of the directory "
                f"{value.path!r} that was never transferred; transfer it with "
                "ChunkedCheckpoint.from_checkpoint(checkpoint).to_object_ref() and pass "
                "that ref"
            )
        raise TypeError(
            "from_object_ref expects a ray.ObjectRef from ChunkedCheckpoint.to_object_ref() "
            f"or the transferred checkpoint it holds; {got} a {type(value).__name__}, "
            "not a checkpoint"
        )

    def handle(self) -> TransferHandle:
        """The transfer handle of a transferred checkpoint.

        Returns:
            Its ``TransferHandle`` (``air_transfer.extend``).

        Raises:
            ValueError: The checkpoint is local (never packed).
        """
        if self._handle is None:
            raise ValueError(
                f"checkpoint at {self.path!r} is local and has no transfer handle until "
                "packed; use checkpoint.pack() or to_object_ref()"
            )
        return self._handle

    @property
    def manifest(self) -> Manifest:
        """What this transferred checkpoint contains (paths, sizes, chunk checksums;
        waits for packing to finish if it is still running)."""
        if self._handle is None:
            raise ValueError(
                f"checkpoint at {self.path!r} is local and has no manifest until packed; "
                "use checkpoint.pack().manifest or transfer it with to_object_ref()"
            )
        if self._handle.pending is not None:
            self._handle = self._handle.complete()
        return self._handle.manifest

    # -- reading -----------------------------------------------------------------------
    def to_directory(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write the checkpoint to ``path`` (a fresh temporary directory if None).

        A transferred checkpoint streams its chunks to disk with bounded memory,
        writing each as it arrives (even while later ones are still being packed),
        and the target shows the result only once complete and verified; an existing
        directory is merged into (the merged tree replaces it in one step).

        Args:
            path: Where to write it (default: a fresh temporary directory, as
                ``ray.train.Checkpoint.to_directory`` picks).

        Returns:
            The directory written.

        Raises:
            ChecksumError: A chunk arrived different from what was packed; nothing
                is published.
            CheckpointLostError: A chunk is gone (its owner died).
        """
        if self._handle is None:
            return super().to_directory(path)
        target = path if path is not None else _ray.temporary_checkpoint_dir(self)
        return self._handle.write_to(os.path.expanduser(os.fspath(target)))

    def open(self, relpath: str) -> io.BufferedIOBase:
        """Stream one file of the checkpoint without writing a directory; only the
        chunks holding that file are fetched.

        Args:
            relpath: The file's path in the checkpoint (relative, POSIX).

        Returns:
            A binary stream of its bytes, each chunk verified as it arrives.

        Raises:
            FileNotFoundError: The checkpoint holds no such file.
        """
        if self._handle is not None:
            return self._handle.open_file(relpath)
        filesystem: pafs.FileSystem = self.filesystem
        stream: io.BufferedIOBase = filesystem.open_input_file(posixpath.join(self.path, relpath))
        return stream

    # -- identity ----------------------------------------------------------------------
    def __repr__(self) -> str:
        if self._handle is None:
            filesystem: pafs.FileSystem = self.filesystem
            return f"ChunkedCheckpoint(filesystem={filesystem.type_name}, path={self.path})"
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


def _packing_chunks(ref: CheckpointRef) -> tuple[Sequence[int], Sequence[PendingChecksum]]:
    """The length and the checksum ref of every chunk of the transfer at ``ref``
    (what a ``PackWatch`` follows)."""
    handle = ChunkedCheckpoint.from_object_ref(ref).handle()
    m = handle.manifest
    lengths = [m.chunk_length(i) for i in range(m.num_chunks)]
    return lengths, handle.pending if handle.pending is not None else m.chunks or ()
