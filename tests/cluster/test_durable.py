"""Node storage with a durable tier on a real S3 API (moto's server over HTTP), on the
shared mock cluster, storage on ``node_a``: writers on every node drained
bit-identical, deletes following; the endpoint down for a while (reports land,
``wait_durable`` names what is missing, then catches up); ``max_lag_bytes`` holding a
report back until the tier caught up; the storage node's agent killed mid-drain (its
successor resumes from the record in the GCS); a path held only in the tier read
from any node, verified, a corrupted object refused."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray

import air_transfer
from air_transfer import ChecksumError, StorageConfig
from air_transfer.cluster.nodes import node_agent
from air_transfer.storage.client.handler import node_storage_handler
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.node_api import NodeDurable
from tests.support.checkpoints import MiB
from tests.support.cluster import node_ids
from tests.support.s3 import S3Server, bucket_server
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("cluster")


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "tier")


def _storage(s3: S3Server, tmp_path: Path, prefix: str, **settings: Any) -> pafs.FileSystem:
    """Node storage on node_a under ``tmp_path/root``, drained into ``tier/prefix``
    through an S3 filesystem that tries each request once (a down endpoint fails
    at once)."""
    root = tmp_path / "root"
    root.mkdir(exist_ok=True)
    durable = (s3.filesystem(attempts=1), f"tier/{prefix}")
    config = StorageConfig(durable=durable, **settings)
    return air_transfer.storage_filesystem(
        node=node_ids()["node_a"], root=str(root), storage=config
    )


def _bucket(s3: S3Server, prefix: str) -> dict[str, bytes]:
    fs: Any = s3.filesystem()
    out = {}
    selector = pafs.FileSelector(f"tier/{prefix}", recursive=True, allow_not_found=True)
    for info in fs.get_file_info(selector):
        rel = info.path[len(f"tier/{prefix}/") :]
        if info.type == pafs.FileType.File and not rel.startswith(".air-transfer/"):
            with fs.open_input_stream(info.path) as f:
                out[rel] = f.read()
    return out


def _disk(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@ray.remote(num_cpus=0)
def _write(fs: pafs.FileSystem, path: str, seed: int, size: int) -> None:
    with fs.open_output_stream(path) as f:
        f.write(random.Random(seed).randbytes(size))


def _writers(fs: pafs.FileSystem, root: Path, names: list[str], size: int) -> None:
    """Write ``names`` under ``root`` at once, from tasks spread over every node."""
    for parent in {str(Path(name).parent) for name in names} - {"."}:
        fs.create_dir(str(root / parent))
    nodes = list(node_ids().values())
    ray.get(
        [
            _write.options(scheduling_strategy=_on(nodes[i % len(nodes)])).remote(
                fs, str(root / name), i, size
            )
            for i, name in enumerate(names)
        ]
    )


def _on(node: str) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node, soft=False)


def test_writers_on_every_node_are_drained_bit_identical_and_deletes_follow(
    s3: S3Server, tmp_path: Path
) -> None:
    fs = _storage(s3, tmp_path, "writers")
    root = tmp_path / "root"
    fs.create_dir(str(root / "run" / "empty"))
    names = [f"run/ckpt_{i % 3}/part-{i}.bin" for i in range(9)]
    _writers(fs, root, names, MiB + 3)
    air_transfer.wait_durable(fs, timeout=120)
    assert _bucket(s3, "writers") == _disk(root)
    state = air_transfer.storage_state(fs, str(root / "run" / "ckpt_1"))
    assert (state.copies, state.durable, state.tier) == (1, True, "durable")
    fs.delete_dir(str(root / "run" / "ckpt_1"))
    air_transfer.wait_durable(fs, str(root / "run"), timeout=120)
    assert _bucket(s3, "writers") == _disk(root)
    assert not any(rel.startswith("run/ckpt_1/") for rel in _bucket(s3, "writers"))


def test_an_endpoint_down_lets_reports_land_and_is_caught_up_with(
    s3: S3Server, tmp_path: Path
) -> None:
    fs = _storage(s3, tmp_path, "down")
    root = tmp_path / "root"
    _writers(fs, root, ["a.bin"], 1000)
    air_transfer.wait_durable(fs, timeout=120)
    s3.proxy.down()
    try:
        _writers(fs, root, ["ckpt/b.bin"], 2 * MiB)  # lands in node storage meanwhile
        with fs.open_input_stream(str(root / "ckpt" / "b.bin")) as f:
            assert len(f.read()) == 2 * MiB
        with pytest.raises(TimeoutError, match=r"ckpt/b\.bin") as caught:
            air_transfer.wait_durable(fs, timeout=3)
        assert "last error" in str(caught.value)
    finally:
        s3.proxy.up()
    air_transfer.wait_durable(fs, timeout=120)
    assert _bucket(s3, "down") == _disk(root)


@ray.remote(num_cpus=0)
def _room(fs: pafs.FileSystem) -> bool:
    handler = node_storage_handler(fs)
    assert handler is not None
    with handler.admitted(1):  # a report of a byte, past max_lag_bytes behind
        return True


def test_max_lag_bytes_holds_a_report_back_until_the_tier_caught_up(
    s3: S3Server, tmp_path: Path
) -> None:
    fs = _storage(s3, tmp_path, "lag", max_lag_bytes=MiB)
    root = tmp_path / "root"
    handler = node_storage_handler(fs)
    assert handler is not None
    s3.proxy.down()
    try:
        _writers(fs, root, ["big.bin"], 3 * MiB)

        def lagging() -> bool:
            return bool(handler.link.call(NodeDurable.durable_status, handler.root).lag_bytes > MiB)

        eventually(lagging, "the drain to count the bytes it could not upload", 60)
        waiting = _room.options(scheduling_strategy=_on(node_ids()["node_b"])).remote(fs)
        ready, _ = ray.wait([waiting], timeout=0)
        assert not ready and lagging()  # the tier cannot catch up while it is down
    finally:
        s3.proxy.up()
    assert ray.get(waiting, timeout=120)
    assert _bucket(s3, "lag") == _disk(root)


def test_a_drain_whose_agent_was_killed_mid_upload_is_resumed(s3: S3Server, tmp_path: Path) -> None:
    """The storage node's agent killed mid-pass: a new one resumes the drain from the
    saved attachment (no credentials in it: the next caller attaches them again),
    what the pass had finished is not sent again, and what was cut off never shows."""
    fs = _storage(s3, tmp_path, "killed", durable_bytes_per_s=4 * MiB, durable_part_bytes=5 * MiB)
    root = tmp_path / "root"
    _writers(fs, root, ["small.bin", "big.bin"], MiB)
    air_transfer.wait_durable(fs, timeout=120)
    _writers(fs, root, ["done.bin"], MiB)
    # ~4 s at 4 MiB/s (a second's worth may go at once): its multipart upload shows
    # once the first 5 MiB part is sent, ~3.75 s before the upload ends: killed mid-way.
    _writers(fs, root, ["big-0.bin"], 20 * MiB)
    client: Any = s3.client()

    def finished_and_uploading() -> bool:
        found = client.list_multipart_uploads(Bucket="tier").get("Uploads", [])
        if not any(u["Key"] == "killed/big-0.bin" for u in found):
            return False
        listed = client.list_objects_v2(Bucket="tier", Prefix="killed/done.bin")
        return bool(listed.get("KeyCount"))

    eventually(finished_and_uploading, "one file finished and one uploading", 60)
    ray.kill(node_agent(node_ids()["node_a"]))
    for rel in _bucket(s3, "killed"):  # what the tier shows is whole, never cut off
        assert _bucket(s3, "killed")[rel] == (root / rel).read_bytes()
    eventually(_agent_back, "a new agent on node_a", 60)  # it resumes the drain itself
    air_transfer.wait_durable(fs, timeout=180)
    assert _bucket(s3, "killed") == _disk(root)
    handler = node_storage_handler(fs)
    assert handler is not None
    status = handler.link.call(NodeDurable.durable_status, handler.root)
    assert status.uploaded_bytes == 20 * MiB  # the cut-off file alone, sent again
    assert not client.list_multipart_uploads(Bucket="tier").get("Uploads")


def _agent_back() -> bool:
    try:
        return bool(ray.get(node_agent(node_ids()["node_a"]).pid.remote(), timeout=10))
    except (ray.exceptions.RayActorError, ValueError):
        return False


def test_a_path_only_in_the_tier_is_read_verified_from_any_node(
    s3: S3Server, tmp_path: Path
) -> None:
    fs = _storage(s3, tmp_path, "reads")
    root = tmp_path / "root"
    _writers(fs, root, ["ckpt/shard.bin"], 5 * MiB + 1)
    air_transfer.wait_durable(fs, timeout=120)
    data = (root / "ckpt" / "shard.bin").read_bytes()
    (root / "ckpt" / "shard.bin").unlink()  # as on a new cluster: only the tier holds it
    (root / "ckpt").rmdir()
    for node in ("head", "node_a", "node_b"):
        got = ray.get(_read.options(scheduling_strategy=_on(node_ids()[node])).remote(fs, root))
        assert got == data, node
    assert [i.path for i in fs.get_file_info(pafs.FileSelector(str(root), recursive=True))] == [
        str(root / "ckpt"),
        str(root / "ckpt" / "shard.bin"),
    ]
    corrupt = bytearray(data)
    corrupt[3 * MiB] ^= 1
    target = DurableTarget.parse((s3.filesystem(), "tier/reads"))
    with target.filesystem.open_output_stream(target.path("ckpt/shard.bin")) as f:
        f.write(bytes(corrupt))
    with pytest.raises(ChecksumError, match="chunk"):
        ray.get(_read.options(scheduling_strategy=_on(node_ids()["node_b"])).remote(fs, root))


@ray.remote(num_cpus=0)
def _read(fs: pafs.FileSystem, root: Path) -> bytes:
    with fs.open_input_file(str(root / "ckpt" / "shard.bin")) as f:
        f.seek(MiB)
        middle = f.read(2 * MiB)
        f.seek(0)
        whole = f.read()
    assert middle == whole[MiB : 3 * MiB]
    return bytes(whole)
