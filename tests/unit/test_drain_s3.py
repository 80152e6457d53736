"""The durable tier's drain against a real S3 API over HTTP (moto's server in a process
of its own, through pyarrow's ``S3FileSystem``; no Ray): drained bit-identical, a
drain killed mid-upload leaves nothing a reader takes for a file (there and on a
local directory), an endpoint down for a while or refusing credentials is retried
and caught up with, its error logged once per kind."""

from __future__ import annotations

import logging
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow.fs as pafs
import pytest

from air_transfer.storage.durable.reads import TierReads
from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget, is_staged
from tests.support.drains import assert_same, drained, draining, local_target
from tests.support.procs import REPO_ROOT, child_env
from tests.support.s3 import S3Server, bucket_server
from tests.support.trees import write_file
from tests.support.waiting import eventually

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "ckpts")


def test_drained_into_s3_bit_identical(s3: S3Server, tmp_path: Path) -> None:
    root = tmp_path / "root"
    rng = random.Random(1)
    for i, size in enumerate((0, 100, 3 * MiB + 5)):
        write_file(root / "run" / "ckpt" / f"{i}.bin", rng.randbytes(size))
    target = DurableTarget.parse(s3.uri("ckpts", "bit-identical"))
    with draining(root, target) as drainer:
        drained(drainer)
    assert_same(root, target)


def _kill_mid_upload(tmp_path: Path, uri: str, started: object, rate: int = MiB) -> Path:
    """A drain child uploading a 12 MiB file at ``rate`` bytes/s, killed once
    ``started`` (an S3 multipart upload shows once its first 5 MiB part is full; the
    7 MiB after it leave the test time to kill the child before the upload ends)."""
    root = tmp_path / "root"
    write_file(root / "big.bin", random.Random(2).randbytes(12 * MiB))
    child = subprocess.Popen(
        [sys.executable, "-m", "tests.support.drain_child", str(root), uri, str(rate)],
        cwd=REPO_ROOT, env=child_env(), stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert child.stdout is not None and child.stdout.readline() == b"draining\n"
        eventually(started, "the upload of big.bin to start", 60)  # type: ignore[arg-type]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    return root


def test_a_drain_killed_mid_upload_leaves_no_object(s3: S3Server, tmp_path: Path) -> None:
    client = s3.client()
    target = DurableTarget.parse(s3.uri("ckpts", "killed"))

    def uploading() -> bool:
        found = client.list_multipart_uploads(Bucket="ckpts")  # type: ignore[attr-defined]
        return any(u["Key"] == "killed/big.bin" for u in found.get("Uploads", []))

    _kill_mid_upload(tmp_path, s3.uri("ckpts", "killed"), uploading, rate=4 * MiB)
    [info] = target.filesystem.get_file_info([target.path("big.bin")])
    assert info.type == pafs.FileType.NotFound
    assert TierReads(target).listing("", True, set()) is None  # no manifest: nothing
    assert uploading()  # the killed drain's upload is still open in the bucket ...
    with draining(tmp_path / "root", target) as drainer:
        drained(drainer)
    assert not uploading()  # ... until the next drain aborts it (S3 bills its parts)
    assert_same(tmp_path / "root", target)


def test_a_drain_killed_mid_upload_leaves_no_file_in_a_directory(tmp_path: Path) -> None:
    durable = tmp_path / "durable"
    target = local_target(durable)

    def staged() -> bool:
        return any(is_staged(p.name) for p in durable.iterdir())

    _kill_mid_upload(tmp_path, f"file://{durable}", staged)
    assert not (durable / "big.bin").exists()
    reads = TierReads(target)
    assert reads.listing("", True, set()) is None  # the staged file is not shown
    assert reads.info(next(p.name for p in durable.iterdir()), set())[0] == (pafs.FileType.NotFound)


def test_an_endpoint_down_for_a_while_is_caught_up_with(
    s3: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reports land while the endpoint is down; the drain retries, then catches up,
    and says so in three lines: it drains, it falls behind, it caught up."""
    from air_transfer.storage.server.drain import loop

    monkeypatch.setattr(loop, "BEHIND_S", 0.0)  # behind at once, for the test
    caplog.set_level(logging.INFO)
    root = tmp_path / "root"
    write_file(root / "a.bin", b"a" * 1000)
    target = DurableTarget.parse((s3.filesystem(attempts=1), "ckpts/down"))
    with draining(root, target) as drainer:
        drained(drainer)
        s3.proxy.down()
        try:
            write_file(root / "b.bin", b"b" * 2000)
            ticket = drainer.request()
            eventually(lambda: drainer.status().errors >= 2, "two failed passes", 60)
            assert drainer.status().completed < ticket
        finally:
            s3.proxy.up()
        drained(drainer, 90)
    assert_same(root, target)
    said = [r.getMessage() for r in caplog.records if r.name.startswith("air_transfer")]
    warned = [m for m in said if "did not take node storage" in m]
    assert len(warned) == 1  # once per kind of error, however many passes failed
    for line in ("drains into the durable tier", "falls behind", "caught up"):
        assert sum(line in m for m in said) == 1, (line, said)


def test_refused_credentials_are_retried_and_never_lose_a_file(
    s3: S3Server, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    root = tmp_path / "root"
    write_file(root / "a.bin", b"a" * 1000)
    refused = DurableTarget.parse(s3.uri("ckpts", "creds", secret="wrong"))
    refused.check()  # logged, not raised: the agents may hold other credentials
    with draining(root, refused) as drainer:
        eventually(lambda: drainer.status().errors >= 1, "a refused pass", 60)
        error = (drainer.status().last_error or "").upper()
        assert "ACCESS" in error or "SIGNATURE" in error, error
    target = DurableTarget.parse(s3.uri("ckpts", "creds"))
    with draining(root, target) as drainer:
        drained(drainer)
    assert_same(root, target)


def test_a_missing_bucket_is_refused_at_construction(s3: S3Server) -> None:
    with pytest.raises(ValueError, match="bucket 'nobucket' does not exist"):
        DurableTarget.parse(s3.uri("nobucket", "x")).check()


def test_the_tier_never_shows_a_name_its_manifests_do_not_name(tmp_path: Path) -> None:
    """A staged upload, or any object no manifest names (a drain killed before its
    manifest, an operator's stray file), is not a file of the tier."""
    root, durable = tmp_path / "root", tmp_path / "durable"
    target = local_target(durable)
    write_file(root / "d" / "f", b"whole")
    with draining(root, target) as drainer:
        drained(drainer)
    write_file(durable / "d" / ".f.air-durable-123", b"half")
    write_file(durable / "d" / "stray", b"?")
    reads = TierReads(target)
    listed = reads.listing("", True, set())
    assert listed is not None and [e[0] for e in listed] == ["d", "d/f"]
    assert reads.info("d/stray", set())[0] == pafs.FileType.NotFound


def test_an_upload_cut_off_mid_way_is_aborted_once_the_endpoint_is_back(
    s3: S3Server, tmp_path: Path
) -> None:
    """The connection cut while parts go up: the upload's abort cannot reach the
    endpoint either, so the next pass, once it answers, aborts what was left open
    (S3 bills the parts of an upload nobody completes or aborts)."""
    mib = 1024 * 1024
    root = tmp_path / "root"
    write_file(root / "big.bin", random.Random(3).randbytes(16 * mib))
    target = DurableTarget.parse((s3.filesystem(attempts=1), "ckpts/cut"))
    settings = DrainSettings(
        chunk_bytes=mib, bytes_per_s=8 * mib, part_bytes=5 * mib, concurrency=1,
        rescan_s=60.0, backoff_s=(0.05, 0.5),
    )  # fmt: skip
    client = s3.client()

    def open_uploads() -> list[str]:
        found = client.list_multipart_uploads(Bucket="ckpts", Prefix="cut/")  # type: ignore[attr-defined]
        return [u["Key"] for u in found.get("Uploads", [])]

    with draining(root, target, settings) as drainer:
        drainer.request()
        eventually(lambda: open_uploads() == ["cut/big.bin"], "a multipart upload to start", 60)
        s3.proxy.down()
        try:
            eventually(lambda: drainer.status().errors >= 1, "the cut pass to fail", 60)
            assert open_uploads() == ["cut/big.bin"]  # its abort did not get through
        finally:
            s3.proxy.up()
        drained(drainer, 90)
    assert open_uploads() == []
    assert_same(root, target)


def test_a_deleted_file_leaves_the_bucket(s3: S3Server, tmp_path: Path) -> None:
    """A delete of one file (a DCP writer's ``.metadata.tmp`` moved away, a file
    deleted) removes its object: on an object store a listing of a file's key is
    empty, so the file itself is looked at first."""
    root = tmp_path / "root"
    write_file(root / "ckpt" / ".metadata.tmp", b"m" * 1000)
    write_file(root / "ckpt" / "shard.bin", b"s" * 2000)
    target = DurableTarget.parse(s3.uri("ckpts", "file-delete"))
    with draining(root, target) as drainer:
        drained(drainer)
        drainer.tombstones.add("ckpt/.metadata.tmp")
        os.replace(root / "ckpt" / ".metadata.tmp", root / "ckpt" / ".metadata")
        for _ in range(4):  # a delete may wait a few passes for a copy from what it deletes
            status = drained(drainer)
            if not status.deletes_pending:
                break
    assert status.deletes_pending == 0
    assert_same(root, target)  # .metadata.tmp is not in the bucket any more


def test_s3_clients_for_different_filesystems_share_one_loaded_model() -> None:
    """Each cached client (one per distinct ``S3FileSystem``) has its own credentials
    and endpoint, but botocore's S3 model is loaded and kept once, not per client."""
    from air_transfer.storage.durable.s3 import client_for

    def fs(key: str, port: int) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key=key, secret_key="s", endpoint_override=f"127.0.0.1:{port}",
            scheme="http", region="us-east-1",
        )  # fmt: skip

    one, two = client_for(fs("one", 9)), client_for(fs("two", 8))
    assert one is not two and one.meta.endpoint_url != two.meta.endpoint_url
    assert one._request_signer._credentials.access_key == "one"
    assert two._request_signer._credentials.access_key == "two"
    assert one._loader is two._loader
