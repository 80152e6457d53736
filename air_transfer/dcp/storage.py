"""``NodeStorageWriter``: torch's own ``FileSystemWriter`` over ``ArrowFiles``, a
``FileSystemBase`` of pyarrow calls (as torch's ``FsspecWriter`` is over fsspec), so
planning, file layout (``__<rank>_<n>.distcp``, ``.metadata`` last) and
deduplication are DCP's. Each rank's files stream into node storage and appear only
whole; the reader is ``dcp.reader``. A file streamed into node storage, which
checksums every chunk, is written without ``torch.save``'s crc32 of each record
(``dcp.crc``: a third of a save's CPU).

A save into a directory that already holds a checkpoint never writes over the files
its metadata names: its own files get names of their own (``__<rank>_<tag>_<n>``),
and its metadata replaces the old one in one rename, after which the files only the
old one named are deleted. A save that dies before that rename leaves the old
checkpoint whole (its files are untouched), never old metadata over new files.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle
import uuid
from typing import Any, cast

import pyarrow.fs as pafs
from torch.distributed.checkpoint.filesystem import (
    FileSystemWriter,
    _StoragePrefix,
)
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import (
    SavePlan,
)
from torch.distributed.checkpoint.storage import WriteResult

from air_transfer.dcp.arrow_files import (
    ArrowFiles,
    KeepUntilRenamedOver,
    ReportFiles,
    files_at,
)

logger = logging.getLogger(__name__)


class NodeStorageWriter(FileSystemWriter):
    """A DCP ``StorageWriter`` into directory ``path`` of ``filesystem``. Without
    one: in a Ray Train worker, the run's storage (``RunConfig``); in a one-node Ray
    cluster, node storage of this node; elsewhere ValueError (which node's disk
    would be a guess: pass ``filesystem=storage_filesystem(node=...)``, made once on
    the driver and handed to every rank). Every rank streams its files
    there as DCP produces them; the coordinator writes ``.metadata`` in ``finish``,
    once every rank's files are whole. Usable with ``dcp.save`` and
    ``dcp.async_save`` (it stages the state dict to CPU, as FileSystemWriter does).

    ``sync_files`` is off: node storage publishes a file when it is closed, and an
    ``os.sync()`` of the writer's own node (torch's fallback for a stream without a
    descriptor) would flush the wrong disk.
    """

    def __init__(self, path: str, filesystem: pafs.FileSystem | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("sync_files", False)
        path, files = files_at(type(self).__name__, path, filesystem)
        super().__init__(path, **kwargs)
        self.fs, self.path = files, files.init_path(path)  # type: ignore[assignment]

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        """Whether DCP may use this writer for ``checkpoint_id``: a path, not a URL."""
        return ArrowFiles.validate_checkpoint_id(checkpoint_id)

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """DCP's plans (``__<rank>_`` file prefixes); where a checkpoint is already
        there, each prefix with a tag of this save, so that none of its files is
        named as a file of that checkpoint (see the module).

        Args:
            plans: Every rank's plan, as DCP's coordinator gathers them.

        Returns:
            The plans, their file prefixes tagged where a checkpoint is there.
        """
        plans = super().prepare_global_plan(plans)
        if not self.fs.exists(self._own_metadata_path()):
            return plans
        tag = uuid.uuid4().hex[:8]
        return [
            dataclasses.replace(p, storage_data=_StoragePrefix(f"{p.storage_data.prefix}{tag}_"))
            for p in plans
        ]

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Publish the metadata by renaming it over the one in place (torch removes
        that one first: a save dying in between would leave no checkpoint at all),
        then delete the files only the replaced one named.

        Args:
            metadata: DCP's metadata of the save.
            results: Every rank's write results.
        """
        path = self._own_metadata_path()
        replaced = self._files_named_by(path)
        fs = cast(ArrowFiles, self.fs)  # where torch's FileSystemWriter has its own
        self.fs = KeepUntilRenamedOver(fs.filesystem, path)  # type: ignore[assignment]
        try:
            super().finish(metadata, results)
        finally:
            self.fs = fs  # type: ignore[assignment]
        kept = {r.storage_data.relative_path for wrs in results for r in wrs}
        for relative in sorted(replaced - kept):
            try:
                self.fs.rm_file(self.fs.concat_path(self.path, relative))
            except FileNotFoundError:
                pass
            except Exception as e:  # the new checkpoint is whole: only space is lost
                logger.warning(
                    "air-transfer: could not delete %s of the checkpoint %s replaced (%s: %s)",
                    relative,
                    self.path,
                    type(e).__name__,
                    e,
                )

    def _own_metadata_path(self) -> str:
        """The metadata file this save publishes (a rank's own without collectives)."""
        rank = self.rank if not self.use_collectives else None
        return str(self._get_metadata_path(rank))

    def _files_named_by(self, path: str) -> set[str]:
        """The files the metadata at ``path`` names (none if there is none, or it
        cannot be read: then nothing is deleted)."""
        try:
            with self.fs.create_stream(path, "rb") as f:
                old = pickle.load(f)
            return {info.relative_path for info in old.storage_data.values()}
        except FileNotFoundError:
            return set()
        except Exception as e:
            logger.warning(
                "air-transfer: the metadata %s being replaced cannot be read (%s: %s); the "
                "files it names are kept",
                path,
                type(e).__name__,
                e,
            )
            return set()


def report_writer(path: str, filesystem: pafs.FileSystem, worker: str) -> NodeStorageWriter:
    """The writer of a Ray Train report's checkpoint ``path``, saved by Train worker
    ``worker`` (its actor id): its directory is noted as that worker's report."""
    writer = NodeStorageWriter(path, filesystem)
    writer.fs = ReportFiles(filesystem, worker)  # type: ignore[assignment]
    return writer
