"""air-transfer: move large Ray Train checkpoints through a Ray cluster in chunks:
linear in size, memory-bounded, verified."""

from air_transfer.checkpoint import ChunkedCheckpoint
from air_transfer.config import TransferConfig
from air_transfer.errors import (
    CheckpointLostError,
    ChecksumError,
    ManifestError,
    SourceChangedError,
)
from air_transfer.future import TransferFuture
from air_transfer.manifest import Entry, Manifest
from air_transfer.nodes import shutdown_agents
from air_transfer.strategies import (
    Packed,
    TransferStrategy,
    get_strategy,
    register_strategy,
    select_strategy,
    strategies,
)
from air_transfer.train import checkpoint_upload_fn, storage_filesystem

__version__ = "0.1.0"

__all__ = [
    "CheckpointLostError",
    "ChecksumError",
    "ChunkedCheckpoint",
    "Entry",
    "Manifest",
    "ManifestError",
    "Packed",
    "SourceChangedError",
    "TransferConfig",
    "TransferFuture",
    "TransferStrategy",
    "checkpoint_upload_fn",
    "get_strategy",
    "register_strategy",
    "select_strategy",
    "shutdown_agents",
    "storage_filesystem",
    "strategies",
]
