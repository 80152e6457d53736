"""air-transfer: move large Ray Train checkpoints through a Ray cluster in chunks:
linear in size, memory-bounded, verified."""

from importlib.metadata import PackageNotFoundError, version

from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.cluster.nodes import node_agent, shutdown_agents
from air_transfer.config import TransferConfig
from air_transfer.core.entry import Entry
from air_transfer.core.manifest import Manifest
from air_transfer.errors import (
    CheckpointLostError,
    ChecksumError,
    ManifestError,
    SourceChangedError,
)
from air_transfer.train import checkpoint_upload_fn, storage_filesystem
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
    "TransferConfig",
    "TransferFuture",
    "TransferStrategy",
    "checkpoint_upload_fn",
    "get_strategy",
    "node_agent",
    "register_strategy",
    "select_strategy",
    "shutdown_agents",
    "storage_filesystem",
    "strategies",
]
