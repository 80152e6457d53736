"""A probe of ``storage_filesystem(placement=...)`` on a mock cluster: the storage
node (the head, the driver's) and 4 worker nodes; each report round, 4 ranks (one a
worker node) each write one shard into the round's directory, and the round before
the last two is deleted (Ray Train's ``num_to_keep=2``). Printed: per round, the
most any node's raylet received (Ray's ``ray_object_manager_bytes``, ``Received``)
in shards; at the end, the bytes the storage node's own root holds on disk
(allocated blocks), whether each rank's node holds its shard, and all placed bytes
over the kept shards' bytes. With ``--incremental --changed F``, storage is
``incremental=True`` and each rank's shard keeps its bytes from round to round but
for its first ``F`` of them (the chunks are ``--chunk-mib``): what a holder
receives after the first round is the changed chunks only.

    python -m benchmarks.placement_probe --placement writer --shard-mib 48
    python -m benchmarks.placement_probe --incremental --changed 0.1 --chunk-mib 4
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.fs as pafs
import ray
from ray.cluster_utils import Cluster

from air_transfer import StorageConfig, TransferConfig, storage_filesystem
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from benchmarks.bench import pushed

MiB = 1024 * 1024
RANKS = 4
ROUNDS = 3


@ray.remote(num_cpus=0)
def _write(fs: pafs.FileSystem, path: str, size: int, seed: int) -> str:
    """Write ``size`` seeded bytes at ``path``; this node's id."""
    data = bytes((seed + i) % 251 for i in range(251)) * (size // 251 + 1)
    with fs.open_output_stream(path) as out:
        for at in range(0, size, 8 * MiB):
            out.write(data[at : min(size, at + 8 * MiB)])
    return str(ray.get_runtime_context().get_node_id())


@ray.remote(num_cpus=0)
def _write_again(fs: pafs.FileSystem, path: str, size: int, rank: int, new: int) -> str:
    """Write rank ``rank``'s ``size`` bytes at ``path``, the same every round but for
    its first ``new`` bytes, drawn afresh; this node's id."""
    data = bytearray(np.random.default_rng(rank).bytes(size))
    data[:new] = os.urandom(new)
    with fs.open_output_stream(path) as out:
        for at in range(0, size, 8 * MiB):
            out.write(data[at : min(size, at + 8 * MiB)])
    return str(ray.get_runtime_context().get_node_id())


def _allocated(root: Path) -> int:
    return sum(
        os.stat(os.path.join(b, f)).st_blocks * 512 for b, _, fs in os.walk(root) for f in fs
    )


def main() -> None:
    args = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args.add_argument("--placement", default="writer", choices=("storage", "writer"))
    args.add_argument("--shard-mib", type=int, default=48)
    args.add_argument("--incremental", action="store_true")
    args.add_argument("--changed", type=float, default=0.1)
    args.add_argument("--chunk-mib", type=int, default=32)
    opts = args.parse_args()
    shard = opts.shard_mib * MiB
    new = round(opts.changed * shard) if opts.incremental else shard
    store = max(256 * MiB, 3 * shard)
    config = {"metrics_report_interval_ms": pushed.REPORT_MS, "preallocate_plasma_memory": False}
    cluster = Cluster()
    cluster.add_node(num_cpus=1, object_store_memory=store, _system_config=config)
    for i in range(RANKS):
        cluster.add_node(num_cpus=1, resources={f"rank{i}": 1}, object_store_memory=store)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, logging_level=logging.ERROR)
    try:
        tmp = Path(tempfile.mkdtemp(prefix="placement-probe-"))
        head = ray.get_runtime_context().get_node_id()
        fs = storage_filesystem(
            node=head,
            config=TransferConfig(chunk_bytes=opts.chunk_mib * MiB),
            root=str(tmp / head),
            storage=StorageConfig(
                replicas=2,
                replica_root=str(tmp / "{node_id}"),
                placement=opts.placement,
                incremental=opts.incremental,
            ),
        )
        urls = pushed.endpoints()
        busiest, nodes = [], {}
        for r in range(ROUNDS):
            fs.create_dir(f"{tmp / head}/checkpoint_{r}")
            before = pushed.snapshot(urls)
            path = f"{tmp / head}/checkpoint_{r}/shard-"
            on = [_write.options(resources={f"rank{i}": 0.01}) for i in range(RANKS)]
            again = [_write_again.options(resources={f"rank{i}": 0.01}) for i in range(RANKS)]
            ranks = [
                again[i].remote(fs, f"{path}{i}", shard, i, new if r else 0)
                if opts.incremental
                else on[i].remote(fs, f"{path}{i}", shard, 7 * r + i)
                for i in range(RANKS)
            ]
            nodes = dict(enumerate(ray.get(ranks)))
            moved = pushed.delta(before, pushed.snapshot(urls, changed_from=before))
            received = {n[:8]: t.get("Received", 0.0) / shard for n, t in moved.items()}
            busiest.append(round(max(received.values()), 2))
            print(f"round {r}: received per node, in shards: {received}")
            if r >= 2:
                fs.delete_dir(f"{tmp / head}/checkpoint_{r - 2}")
        kept = 2 * RANKS * shard
        placed = {
            e[: -len(".placed")]: _allocated(tmp / e)
            for e in os.listdir(tmp)
            if e.endswith(".placed")
        }
        handler = node_storage_handler(fs)
        own = {}
        for i, n in nodes.items():  # each kept shard's first holder is its writer's node
            records = [
                handler.record_of(f"{tmp / head}/checkpoint_{r}/shard-{i}")
                if isinstance(handler, WriterPlacedHandler)
                else None
                for r in (ROUNDS - 2, ROUNDS - 1)
            ]
            own[i] = all(rec is not None and rec.holders[0][0] == n for rec in records)
        print(
            json.dumps(
                {
                    "placement": opts.placement,
                    "shard_mib": opts.shard_mib,
                    "incremental": opts.incremental,
                    "changed": opts.changed if opts.incremental else 1.0,
                    "chunk_mib": opts.chunk_mib,
                    "busiest_node_received_shards_per_round": busiest,
                    "storage_root_shards_on_disk": round(_allocated(tmp / head) / shard, 3),
                    "each_rank_node_holds_its_shards": own,
                    "all_placed_over_kept": round(sum(placed.values()) / kept, 3),
                    "all_copies_on_disk_over_kept": round(_allocated(tmp) / kept, 3),
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
