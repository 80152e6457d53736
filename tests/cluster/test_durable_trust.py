"""Node storage with a durable tier on a real S3 API (moto's server over HTTP), on the
shared mock cluster: a URI's secret is nowhere a job can read it (the GCS, reprs,
errors, logs), its agent resumed without it until a caller attaches the tier again;
what node storage does not hold waits for an endpoint that is down, within a bound,
then says the endpoint is down, while what node storage holds is answered at once;
``storage_state`` asks the bucket itself."""

from __future__ import annotations

import logging
import threading
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray

import air_transfer
from air_transfer import StorageConfig
from air_transfer.cluster import _ray_core
from air_transfer.cluster.nodes import NAMESPACE, node_agent
from air_transfer.storage.durable.target import DurableTarget
from tests.cluster.test_durable import _agent_back, _writers
from tests.support.checkpoints import MiB
from tests.support.cluster import node_ids
from tests.support.s3 import S3Server, bucket_server
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("cluster")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "trust")


def _storage(uri: str, root: Path, **settings: Any) -> pafs.FileSystem:
    root.mkdir(exist_ok=True)
    config = StorageConfig(durable=uri, **settings)
    return air_transfer.storage_filesystem(
        node=node_ids()["node_a"], root=str(root), storage=config
    )


def test_no_secret_is_kept_where_a_job_can_read_it(
    s3: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    uri = s3.uri("trust", "secret")
    secrets = {s3.secret, urllib.parse.quote(s3.secret, safe="")}
    fs = _storage(uri, tmp_path / "root")
    _writers(fs, tmp_path / "root", ["a.bin"], MiB)
    air_transfer.wait_durable(fs, timeout=120)
    ray.kill(node_agent(node_ids()["node_a"]))  # a new agent resumes from what was saved
    eventually(_agent_back, "a new agent on node_a", 60)
    _writers(fs, tmp_path / "root", ["b.bin"], MiB)
    air_transfer.wait_durable(fs, timeout=120)  # the caller attached its credentials again
    saved = _ray_core.kv_items(NAMESPACE, "")
    assert saved  # the attachment, the journal, the tombstones: all without the secret
    shown = [repr(fs), str(fs), repr(StorageConfig(durable=uri)), caplog.text]
    shown += [str(v) for v in saved.values()] + [str(DurableTarget.parse(uri))]
    with pytest.raises(ValueError) as refused:
        DurableTarget.parse(uri.replace("region=", "regoin="))
    shown.append(str(refused.value))
    for secret in secrets:
        assert not any(secret in text for text in shown)
        assert not any(secret.encode() in value for value in saved.values())


def test_what_only_the_tier_holds_waits_for_an_endpoint_that_is_down_then_says_so(
    s3: S3Server, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    fs = _storage(s3.uri("trust", "down"), root, durable_read_wait_s=3.0)
    _writers(fs, root, ["run/old.bin", "run/held.bin"], 1000)
    air_transfer.wait_durable(fs, timeout=120)
    (root / "run" / "old.bin").unlink()  # only the tier holds it now (a new cluster's disk)
    ray.kill(node_agent(node_ids()["node_a"]))  # a new agent: nothing read before
    eventually(_agent_back, "a new agent on node_a", 60)
    fs = _storage(s3.uri("trust", "down"), root, durable_read_wait_s=3.0)  # a new caller
    s3.proxy.down()
    back = threading.Timer(1.0, s3.proxy.up)
    try:
        [held] = fs.get_file_info([str(root / "run" / "held.bin")])  # at once
        assert held.type == pafs.FileType.File
        with pytest.raises(ConnectionError, match="did not answer for 3 s") as down:
            fs.get_file_info([str(root / "run" / "old.bin")])
        assert "durable tier s3://" in str(down.value)
        back.start()
        [old] = fs.get_file_info([str(root / "run" / "old.bin")])  # waited, then answered
    finally:
        if back.is_alive() or back.finished.is_set():
            back.join()  # the endpoint is up again (or about to be)
        else:
            s3.proxy.up()
    assert (old.type, old.size) == (pafs.FileType.File, 1000)


def test_storage_state_asks_the_bucket_itself(s3: S3Server, tmp_path: Path) -> None:
    """An object deleted from the bucket: ``storage_state`` says the path is not
    durable (the drain's memory says it is), and ``wait_durable`` sends it again."""
    root = tmp_path / "root"
    fs = _storage(s3.uri("trust", "state"), root)
    _writers(fs, root, ["ckpt/model.bin"], MiB)
    air_transfer.wait_durable(fs, timeout=120)
    path = str(root / "ckpt")
    assert air_transfer.storage_state(fs, path).tier == "durable"
    client: Any = s3.client()
    client.delete_object(Bucket="trust", Key="state/ckpt/model.bin")
    assert air_transfer.storage_state(fs, path).tier == "local"
    air_transfer.wait_durable(fs, timeout=120)
    assert air_transfer.storage_state(fs, path).tier == "durable"
    body = client.get_object(Bucket="trust", Key="state/ckpt/model.bin")["Body"].read()
    assert body == (root / "ckpt" / "model.bin").read_bytes()
