"""air-transfer: move large Ray Train checkpoints through a Ray cluster in chunks:
linear in size, memory-bounded, verified.

``ChunkedCheckpoint``, ``storage_filesystem`` and ``checkpoint_upload_fn`` are
imported at first use (PEP 562): they need Ray Train, whose import (pandas, Ray
Data) costs ~1 s of CPU, and every process that runs the library's code (each
node's agent, each packing task's worker) imports this package, most of them never
touching Ray Train.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any

from air_transfer.cluster.nodes import node_agent, shutdown_agents
from air_transfer.config import StorageConfig, TransferConfig
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.errors import (
    CheckpointLostError,
    ChecksumError,
    ManifestError,
    SourceChangedError,
)
from air_transfer.transfer.future import TransferFuture
from air_transfer.transfer.strategies import (
    Packed,
    PackRequest,
    TransferStrategy,
    get_strategy,
    register_strategy,
    select_strategy,
    strategies,
)

if TYPE_CHECKING:
    from air_transfer.checkpoint import ChunkedCheckpoint
    from air_transfer.train import (
        checkpoint_upload_fn,
        replica_status,
        storage_filesystem,
        storage_state,
        wait_durable,
    )

#: The public names that need Ray Train, and the module each comes from.
_ON_FIRST_USE = {
    "ChunkedCheckpoint": "air_transfer.checkpoint",
    "checkpoint_upload_fn": "air_transfer.train",
    "replica_status": "air_transfer.train",
    "storage_filesystem": "air_transfer.train",
    "storage_state": "air_transfer.train",
    "wait_durable": "air_transfer.train",
}


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module 'air_transfer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})


try:
    __version__ = version("air-transfer")
except PackageNotFoundError:  # imported from a source tree that was never installed
    __version__ = "0+unknown"

__all__ = [
    "CheckpointLostError",
    "ChecksumError",
    "ChunkedCheckpoint",
    "Entry",
    "Manifest",
    "ManifestError",
    "PackRequest",
    "Packed",
    "SourceChangedError",
    "StorageConfig",
    "TransferConfig",
    "TransferFuture",
    "TransferStrategy",
    "checkpoint_upload_fn",
    "get_strategy",
    "node_agent",
    "register_strategy",
    "replica_status",
    "select_strategy",
    "shutdown_agents",
    "storage_filesystem",
    "storage_state",
    "strategies",
    "wait_durable",
]
