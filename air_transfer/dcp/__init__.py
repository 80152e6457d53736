"""torch Distributed Checkpoint (DCP) straight into node storage, and the Ray Train
recipe around it: the one package that imports torch.

Ray's DCP recipe saves each rank's shard into a local temporary directory, reports
it, and Train copies it into storage; a restore downloads every rank's shards onto
every node before ``dcp.load`` reads its part. Here ``NodeStorageWriter`` streams
each rank's files into a pyarrow filesystem (``storage_filesystem()``: chunked,
checksummed, each file appearing only when closed whole) and writes the metadata
file last, so the reported checkpoint is already in storage; ``NodeStorageReader``
reads only the byte ranges this rank's ``ReadItem``s need, and copies nothing into
the caller's tensors until every one of them has been read and decoded.

Inside a Ray Train worker, ``report(metrics, state_dict=...)`` (``ray.train.report``'s
order) and ``load(state_dict)`` are the whole recipe. Outside Train, make the
filesystem once on the driver and hand it to every rank::

    fs = air_transfer.storage_filesystem(node="head")
    dcp.save(state_dict, storage_writer=NodeStorageWriter("/abs/ckpt", fs))
    dcp.load(state_dict, storage_reader=NodeStorageReader("/abs/ckpt", fs))

Both classes are torch's own ``FileSystemWriter`` and ``FileSystemReader`` over a
``FileSystemBase`` of pyarrow calls (as torch's ``FsspecWriter`` is over fsspec), so
planning, file layout (``__<rank>_<n>.distcp``, ``.metadata``), deduplication and
resharding are DCP's.
"""

from air_transfer.dcp import requires as _requires  # torch and Ray Train v2, first
from air_transfer.dcp.reader import NodeStorageReader
from air_transfer.dcp.storage import NodeStorageWriter
from air_transfer.dcp.train import load, report, wait_for_pending_save

del _requires

__all__ = ["NodeStorageReader", "NodeStorageWriter", "load", "report", "wait_for_pending_save"]
