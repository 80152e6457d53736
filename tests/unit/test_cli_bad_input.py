"""What the ``air-transfer`` command refuses or hides, without Ray: a cluster address
that leads nowhere fails within seconds naming it (where Ray retried for minutes), a
URI's secret never reaches the output (errors, ``cp``'s line and its JSON), a
destination that names no path is refused by name, and ``clean``'s age must be a
finite number (``nan`` removed a live upload)."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from air_transfer.cli.main import main
from air_transfer.cli.output import redact
from air_transfer.storage.server.leftovers import clean_tree
from tests.support.procs import REPO_ROOT, child_env
from tests.support.s3 import S3Server, bucket_server

#: A guard against a hang only (Ray's own retries ran past 240 s), not a timing.
HANG_S = 120


def command(*args: str) -> subprocess.CompletedProcess[str]:
    """``air-transfer ARGS`` as a user runs it, in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "air_transfer.cli", *args],
        cwd=REPO_ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_an_address_where_nothing_listens_fails_naming_it() -> None:
    """Defect: ``--address 127.0.0.1:1`` printed Ray's retries and never answered."""
    done = command("ls", "/mnt/runs", "--address", "127.0.0.1:1")
    assert done.returncode == 1
    [line] = [x for x in done.stderr.splitlines() if x.startswith("air-transfer ls: error:")]
    assert "(--address 127.0.0.1:1)" in line and "connection refused" in line, line
    assert "Failed to connect to GCS" not in done.stderr  # none of Ray's retries


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (not a Ray GCS)."""
    with socket.socket() as listener:
        listener.bind(("0.0.0.0", 0))  # Ray dials the node's address for 127.0.0.1
        listener.listen(8)
        yield int(listener.getsockname()[1])


def test_an_address_that_is_no_ray_gcs_fails_naming_it(silent_port: int) -> None:
    """Something listens there (a dashboard's port, say) but no GCS answers."""
    address = f"127.0.0.1:{silent_port}"
    done = command("ls", "/mnt/runs", "--address", address, "--connect-timeout", "1")
    assert done.returncode == 1
    assert f"(--address 127.0.0.1:{silent_port}) answered as a Ray GCS within 1 s" in done.stderr
    assert "not the dashboard's (8265)" in done.stderr


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("s3://AKIAKEY:se%2Fcr+et@bucket/runs", "s3://AKIAKEY:***@bucket/runs"),
        ("error at s3://K:a/b:c@d@bucket/x now", "error at s3://K:***@bucket/x now"),
        ("gs://bucket/a:b@c", "gs://bucket/a:b@c"),  # no user: nothing secret
        ("node:///mnt/x and /tmp/a:b@c", "node:///mnt/x and /tmp/a:b@c"),
    ],
)
def test_a_uris_secret_is_hidden(text: str, shown: str) -> None:
    assert redact(text) == shown


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "backups")


def test_cp_never_prints_the_secret_of_a_uri(
    s3: S3Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its line, its JSON, its progress bars and its errors name the URI with its
    secret hidden; the copy itself uses the secret."""
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "model.bin").write_bytes(b"m" * 1000)
    uri = s3.uri("backups", "run/ck")
    assert main(["cp", str(tmp_path / "ck"), uri, "--progress"]) == 0
    out, err = capsys.readouterr()
    assert "copied" in out and ":***@backups/run/ck" in out
    assert main(["cp", str(tmp_path / "ck"), uri, "--json", "--overwrite"]) == 0
    done = capsys.readouterr()
    assert json.loads(done.out)["files"] == 1
    assert main(["cp", str(tmp_path / "ck"), uri]) == 1  # exists: an error naming it
    refused = capsys.readouterr().err
    assert ":***@backups/run/ck" in refused and "exists" in refused
    printed = out + err + done.out + done.err + refused
    for secret in (s3.secret, s3.uri("x", "y").split(":", 2)[2].split("@")[0]):
        assert secret not in printed


def test_cp_refuses_a_destination_that_names_no_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Defect: ``cp SRC s3://`` failed with "error:  exists" (an empty name)."""
    (tmp_path / "f").write_bytes(b"x")
    assert main(["cp", str(tmp_path / "f"), "s3://"]) == 1
    err = capsys.readouterr().err
    assert "'s3://' names no path: give the whole of it (s3://BUCKET/PATH)" in err


@pytest.mark.parametrize("age", [math.nan, math.inf, -1.0])
def test_clean_tree_refuses_an_age_that_is_no_finite_number(tmp_path: Path, age: float) -> None:
    upload = tmp_path / ".model.bin.air-upload-0123456789abcdef"
    upload.write_bytes(b"live")
    with pytest.raises(ValueError, match="finite number >= 0"):
        clean_tree(str(tmp_path), upload_age_s=age)
    assert upload.exists()
