"""Writer placement across failure domains: a file's second holder is in another zone
than its writer (Ray's ``ray.io/availability-zone`` label, as KubeRay and the cloud
launchers set it) even where the next node by id shares the writer's zone; with
``failure_domain=None`` the zones are not looked at. The shared cluster's head and
``node_a`` are in ``zone-1``, ``node_b`` in ``zone-2`` (``tests.support.cluster``)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray

from air_transfer import StorageConfig, storage_filesystem
from air_transfer.cluster._ray_core import kv_get
from air_transfer.cluster.nodes import NAMESPACE, node_labels
from air_transfer.config import ZONE_LABEL
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.replica_wire import PLACED_PREFIX
from tests.support.checkpoints import MiB, on
from tests.support.cluster import SHARED_ZONES, node_ids
from tests.support.node_storage import CONFIG, read

pytestmark = pytest.mark.usefixtures("cluster")


def _placed(tmp: Path, failure_domain: str | None) -> WriterPlacedHandler:
    head = node_ids()["head"]
    storage = StorageConfig(
        replicas=2,
        replica_root=str(tmp / "copies" / "{node_id}"),
        placement="writer",
        failure_domain=failure_domain,
    )
    fs = storage_filesystem(
        node=head, config=CONFIG, root=str(tmp / "copies" / head), storage=storage
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, WriterPlacedHandler)
    return handler


@ray.remote(num_cpus=0)
def _write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as out:
        out.write(data)


def _writer_next_to_its_zone() -> tuple[str, str]:
    """A ``zone-1`` node (by name) whose next node by id is the other ``zone-1`` node,
    and that node's id: there is always one, two of three nodes on a ring."""
    ids = node_ids()
    ring = sorted(ids[n] for n in SHARED_ZONES)
    zone1 = [n for n, labels in SHARED_ZONES.items() if labels[ZONE_LABEL] == "zone-1"]
    for name in zone1:
        following = ring[(ring.index(ids[name]) + 1) % len(ring)]
        if following in {ids[n] for n in zone1}:
            return name, following
    raise AssertionError(f"no zone-1 node followed by zone-1 in {ring}")


def test_ray_says_each_nodes_zone() -> None:
    ids = node_ids()
    zones = node_labels(ZONE_LABEL)
    assert {n: zones.get(ids[n]) for n in SHARED_ZONES} == {
        n: labels[ZONE_LABEL] for n, labels in SHARED_ZONES.items()
    }
    assert node_labels(None) == {}


@pytest.mark.parametrize("failure_domain", [ZONE_LABEL, None], ids=["zones", "no-domain"])
def test_a_files_second_holder_is_in_another_zone_unless_zones_are_not_looked_at(
    tmp_path: Path, failure_domain: str | None
) -> None:
    """The writer's next node by id shares its zone: by zone, the copy goes to the
    other zone's node; with ``failure_domain=None``, to that next node."""
    writer, same_zone = _writer_next_to_its_zone()
    second = node_ids()["node_b"] if failure_domain else same_zone
    h = _placed(tmp_path, failure_domain)
    fs, data = pafs.PyFileSystem(h), os.urandom(2 * MiB + 11)
    ray.get(_write.options(**on(writer)).remote(fs, f"{h.root}/shard.bin", data))
    record = h.record_of(f"{h.root}/shard.bin")
    assert record is not None
    assert [n for n, _ in record.holders] == [node_ids()[writer], second]
    assert read(fs, f"{h.root}/shard.bin") == data
    for node, root in record.holders:
        assert (Path(root) / record.blob).read_bytes() == data, node
    # The registry's background pass repairs by the same domains.
    announced = kv_get(NAMESPACE, PLACED_PREFIX + h.key)
    assert announced is not None and json.loads(announced) == {"failure_domain": failure_domain}


def test_a_storage_of_the_storage_layout_is_not_announced_as_placed(tmp_path: Path) -> None:
    """The background pass over placed files never looks into it."""
    head = node_ids()["head"]
    fs = storage_filesystem(
        node=head,
        config=CONFIG,
        root=str(tmp_path / "copies" / head),
        replicas=2,
        replica_root=str(tmp_path / "copies" / "{node_id}"),
    )
    with fs.open_output_stream(f"{tmp_path}/copies/{head}/f") as out:
        out.write(os.urandom(2 * MiB))
    assert kv_get(NAMESPACE, PLACED_PREFIX + node_storage_handler(fs).key) is None
