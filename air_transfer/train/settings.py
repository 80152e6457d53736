"""``storage_filesystem()``'s settings, checked once at the entrance: its root
given its default or refused (``root``), its keywords folded into one
``StorageConfig`` (validated as it is built), the transfers' ``TransferConfig``
given the storage's part of it, the nodes named checked (and resolved where Ray
runs), the durable tier parsed and checked. The drain's ``DrainSettings`` are built
from them here, and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

import ray

from air_transfer.cluster.nodes import check_node_spec, resolve_node, this_node_id
from air_transfer.config import StorageConfig, TransferConfig
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.train.root import storage_root


@dataclass(frozen=True)
class StorageSettings:
    """A node storage's settings as ``storage_filesystem()`` took them: its ``node``
    (None: the first user's), ``root``, the transfers' ``config`` and the
    ``storage``'s, and its ``durable`` tier, parsed."""

    node: str | None
    root: str
    config: TransferConfig
    storage: StorageConfig
    durable: DurableTarget | None

    @property
    def replicated(self) -> bool:
        """Whether the files are kept on several nodes (or on nodes named)."""
        return self.storage.replicas != 1 or bool(self.storage.replica_nodes)

    @property
    def drain(self) -> DrainSettings | None:
        """How the durable tier is fed (None without one)."""
        if self.durable is None:
            return None
        storage = self.storage
        return DrainSettings(
            concurrency=storage.durable_concurrency,
            bytes_per_s=storage.durable_bytes_per_s,
            chunk_bytes=self.config.chunk_bytes,
            last=storage.durable_last,
            max_lag_bytes=storage.max_lag_bytes,
            scrub_s=storage.durable_scrub_s,
            scrub_bytes_per_s=storage.durable_scrub_bytes_per_s,
            read_wait_s=storage.durable_read_wait_s,
            part_bytes=storage.durable_part_bytes,
            codec=storage.durable_codec,
            placed_root=storage.replica_root if storage.placement == "writer" else None,
        )


def storage_settings(
    node: str | None,
    config: object,
    root: str | None,
    keywords: StorageConfig,
    storage: object,
    expose_system_dirs: bool = False,
) -> StorageSettings:
    """The settings of ``storage_filesystem(node=, config=, root=, storage=,
    expose_system_dirs=)``, ``keywords`` being its other keywords as a
    ``StorageConfig``: checked, the root given its default (``root.storage_root``),
    and the nodes resolved where Ray runs; TypeError or ValueError naming what is
    wrong."""
    root = storage_root(root, expose_system_dirs)
    chosen = _one_storage_config(keywords, storage)
    transfers = _transfer_config(config, chosen if storage is not None else None)
    if node is not None:
        check_node_spec(node)
    for named in chosen.replica_nodes:
        check_node_spec(named)
    if ray.is_initialized():
        node = this_node_id() if node is None else resolve_node(node)
        chosen = chosen.replace(replica_nodes=tuple(map(resolve_node, chosen.replica_nodes)))
    durable = None
    if chosen.durable is not None:
        durable = DurableTarget.parse(chosen.durable)
        if root == "/":
            raise ValueError(
                "storage_filesystem(durable=...) needs a root of its own (root='/abs/dir'): "
                "the durable tier receives everything under the root"
            )
        durable.check()
    return StorageSettings(node, root, transfers, chosen, durable)


def _one_storage_config(keywords: StorageConfig, storage: object) -> StorageConfig:
    """``storage``, or the keywords; not both."""
    if storage is None:
        return keywords
    if not isinstance(storage, StorageConfig):
        raise TypeError(f"storage must be a StorageConfig, got {type(storage).__name__}")
    if keywords != StorageConfig():
        raise ValueError(
            "pass replicas, replica_nodes, replica_root, placement and durable either as keywords "
            "or in storage=StorageConfig(...), not both"
        )
    return storage


def _transfer_config(config: object, storage: StorageConfig | None) -> TransferConfig:
    """The transfers' config, with ``storage``'s ``incremental`` and ``cache_bytes``
    where a ``StorageConfig`` was given (they are set there, not in both)."""
    if config is not None and not isinstance(config, TransferConfig):
        raise TypeError(f"config must be a TransferConfig, got {type(config).__name__}")
    base = config or TransferConfig()
    if storage is None:
        return base
    default = TransferConfig()
    if (base.incremental, base.cache_bytes) != (default.incremental, default.cache_bytes):
        raise ValueError(
            "set incremental and cache_bytes in storage=StorageConfig(...), not in the "
            "TransferConfig as well"
        )
    return base.replace(incremental=storage.incremental, cache_bytes=storage.cache_bytes)
