"""Replicated node storage with a durable tier (moto's S3 server over HTTP): the
storage node's copy drains it while it is fresh; when that node is removed
mid-upload, the surviving copy's agent takes the drain over and finishes it, and the
bucket then holds the surviving copy's files bit-identical, nothing cut off."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from ray.cluster_utils import Cluster

import air_transfer
from air_transfer import StorageConfig
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.client.replicas import ReplicatedHandler
from tests.support.checkpoints import MiB
from tests.support.cluster import node_ids
from tests.support.node_storage import CONFIG
from tests.support.replicas import remove, tree, view, workers
from tests.support.s3 import S3Server, bucket_server
from tests.support.waiting import eventually


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "tier")


def _bucket(s3: S3Server, prefix: str) -> dict[str, bytes | None]:
    fs: Any = s3.filesystem()
    selector = pafs.FileSelector(f"tier/{prefix}", recursive=True, allow_not_found=True)
    out: dict[str, bytes | None] = {}
    for info in fs.get_file_info(selector):
        rel = info.path[len(f"tier/{prefix}/") :]
        if rel.startswith(".air-transfer"):
            continue
        if info.type == pafs.FileType.File:
            with fs.open_input_stream(info.path) as f:
                out[rel] = f.read()
    return out


def test_a_surviving_copy_finishes_the_drain_when_the_storage_node_goes(
    cluster4: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    w = workers()
    ids = node_ids()
    primary, other = ids[w[0]], ids[w[1]]
    storage = StorageConfig(
        replicas=2,
        replica_nodes=(other,),
        replica_root=str(tmp_path / "copies" / "{node_id}"),
        durable=(s3.filesystem(attempts=1), "tier/replicated"),
        durable_bytes_per_s=4 * MiB,  # slow enough to remove the node mid-upload
        durable_part_bytes=5 * MiB,  # a multipart upload from the first 5 MiB on
    )
    fs = air_transfer.storage_filesystem(
        node=primary, config=CONFIG, root=str(tmp_path / "copies" / primary), storage=storage
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, ReplicatedHandler)
    fs.create_dir(f"{handler.root}/ckpt")
    for i in range(2):
        with fs.open_output_stream(f"{handler.root}/ckpt/part-{i}.bin") as out:
            out.write(os.urandom(10 * MiB + i))
    client: Any = s3.client()

    def uploading() -> bool:
        found = client.list_multipart_uploads(Bucket="tier").get("Uploads", [])
        return any(u["Key"].startswith("replicated/ckpt/") for u in found)

    eventually(uploading, "the storage node's drain to start an upload", 60)
    remove(cluster4, primary)
    cut_off = _bucket(s3, "replicated")  # the upload in flight never completed
    eventually(lambda: primary not in view(handler)[1], "the lost copy marked stale", 60)
    air_transfer.wait_durable(fs, timeout=180)  # the surviving copy's agent drains
    survivor = view(handler)[0][other]
    expected = {k: v for k, v in tree(survivor).items() if v is not None}
    assert expected and _bucket(s3, "replicated") == expected
    assert cut_off != expected  # so the surviving copy's agent uploaded the rest
    state = air_transfer.storage_state(fs, f"{handler.root}/ckpt")
    assert state.durable and state.copies >= 1


def test_wait_durable_follows_the_copy_that_leads_once_the_storage_node_is_gone(
    cluster4: Cluster, s3: S3Server, tmp_path: Path
) -> None:
    """The storage node removed right after a file was closed, before the bucket
    has it, and ``wait_durable`` called at once (the registry has not yet marked the
    lost copy stale): the wait follows the copy that leads the drain next, and the
    bucket then holds the file whole."""
    w = workers()
    ids = node_ids()
    primary, other = ids[w[0]], ids[w[1]]
    storage = StorageConfig(
        replicas=2,
        replica_nodes=(other,),
        replica_root=str(tmp_path / "copies" / "{node_id}"),
        durable=(s3.filesystem(attempts=1), "tier/follow"),
        durable_bytes_per_s=8 * MiB,
    )
    fs = air_transfer.storage_filesystem(
        node=primary, config=CONFIG, root=str(tmp_path / "copies" / primary), storage=storage
    )
    handler = node_storage_handler(fs)
    assert isinstance(handler, ReplicatedHandler)
    data = os.urandom(24 * MiB + 5)
    with fs.open_output_stream(f"{handler.root}/model.bin") as out:
        out.write(data)
    remove(cluster4, primary)
    air_transfer.wait_durable(fs, timeout=180)
    assert _bucket(s3, "follow") == {"model.bin": data}
