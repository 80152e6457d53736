"""air-transfer: move large Ray Train checkpoints through a Ray cluster in chunks:
linear in size, memory-bounded, verified.

The user API is what ``__all__`` lists; ``air_transfer.dcp`` is torch DCP through
node storage, ``air_transfer.extend`` the API for new transfer strategies.

``ChunkedCheckpoint``, ``storage_filesystem``, ``run_config`` and ``checkpoint_upload_fn`` are
imported at first use (PEP 562): they need Ray Train, whose import (pandas, Ray
Data) costs ~1 s of CPU, and every process that runs the library's code (each
node's agent, each packing task's worker) imports this package, most of them never
touching Ray Train.

For the same reason this module is where the layers meet: it hands the lower layers
the classes above them they start or store (``core.provided``): the agent's class to
``cluster.nodes``, the checkpoint class to ``transfer.start``, the replica
registry's class to ``storage.client.replica_set``, each imported at first use. The
lazy public names below are the one place the package imports by dotted name.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from air_transfer.cluster.nodes import AGENT_CLASS, node_agent, shutdown_agents
from air_transfer.config import StorageConfig, TransferConfig
from air_transfer.core.environ import package_version
from air_transfer.core.ray_range import warn_if_unsupported
from air_transfer.errors import (
    CheckpointLostError,
    ChecksumError,
    ManifestError,
    SourceChangedError,
)
from air_transfer.storage.client.checkpoints import CheckpointInfo, list_checkpoints
from air_transfer.storage.client.durable_wait import StorageState
from air_transfer.storage.client.replica_set import REGISTRY_CLASS
from air_transfer.storage.replica_wire import PLACED_PASS, PLACED_SWEEP
from air_transfer.transfer.future import TransferFuture
from air_transfer.transfer.handle import TransferHandle
from air_transfer.transfer.start import CHECKPOINT_OF

if TYPE_CHECKING:
    from air_transfer.checkpoint import ChunkedCheckpoint
    from air_transfer.train import (
        checkpoint_upload_fn,
        replica_status,
        run_config,
        storage_filesystem,
        storage_state,
        wait_durable,
    )

#: The public names that need Ray Train, and the module each comes from.
_ON_FIRST_USE = {
    "ChunkedCheckpoint": "air_transfer.checkpoint",
    "checkpoint_upload_fn": "air_transfer.train",
    "replica_status": "air_transfer.train",
    "run_config": "air_transfer.train",
    "storage_filesystem": "air_transfer.train",
    "storage_state": "air_transfer.train",
    "wait_durable": "air_transfer.train",
}
#: Names of the extension API that this module used to export: still importable
#: from here, with a DeprecationWarning, until the release after next.
_MOVED_TO_EXTEND = frozenset(
    {
        "Entry",
        "Manifest",
        "PackRequest",
        "Packed",
        "TransferStrategy",
        "get_strategy",
        "register_strategy",
        "select_strategy",
        "strategies",
    }
)


def __getattr__(name: str) -> Any:
    if name in _MOVED_TO_EXTEND:
        warnings.warn(
            f"air_transfer.{name} moved to air_transfer.extend.{name} (the extension "
            "API); importing it from air_transfer is deprecated",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module("air_transfer.extend"), name)
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module 'air_transfer' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def _agent_class() -> type:
    from air_transfer.agent import NodeAgent

    return NodeAgent


def _registry_class() -> type:
    from air_transfer.storage.server.replica_host import ReplicaHost

    return ReplicaHost


def _placed_pass() -> Callable[[list[tuple[str, str, int]], set[str], set[str]], list[str]]:
    from air_transfer.storage.client.placed_keeper import keep_placed

    return keep_placed


def _placed_sweep() -> Callable[[list[tuple[str, str, int]]], list[str]]:
    from air_transfer.storage.client.placed_keeper import sweep_dead_writers

    return sweep_dead_writers


def _checkpoint_of() -> Callable[[TransferHandle], object]:
    from air_transfer.checkpoint import ChunkedCheckpoint

    return ChunkedCheckpoint._from_handle


warn_if_unsupported()  # once, in the importing process (not in Ray's workers)
AGENT_CLASS.provide(_agent_class)
REGISTRY_CLASS.provide(_registry_class)
PLACED_PASS.provide(_placed_pass)
PLACED_SWEEP.provide(_placed_sweep)
CHECKPOINT_OF.provide(_checkpoint_of)


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})


__version__ = package_version()  # "0+unknown" from a source tree never installed

__all__ = [
    "CheckpointInfo",
    "CheckpointLostError",
    "ChecksumError",
    "ChunkedCheckpoint",
    "ManifestError",
    "SourceChangedError",
    "StorageConfig",
    "StorageState",
    "TransferConfig",
    "TransferFuture",
    "checkpoint_upload_fn",
    "list_checkpoints",
    "node_agent",
    "replica_status",
    "run_config",
    "shutdown_agents",
    "storage_filesystem",
    "storage_state",
    "wait_durable",
]
