"""How ``air-transfer`` joins the running cluster (the shared local Ray), in a
process of its own: it says on stderr which cluster it joined (``--address auto``
joined whatever Ray found without a word), a cluster that refuses its token is
named with the cause (it was reported as "no running Ray cluster"), and
``--durable`` with a URI's secret never shows that secret."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from air_transfer.cli.main import main
from tests.support.procs import REPO_ROOT, child_env

pytestmark = pytest.mark.usefixtures("ray_local")

#: A guard against a hang only (Ray's own retries ran for minutes), not a timing.
HANG_S = 120


def command(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "air_transfer.cli", *args],
        cwd=REPO_ROOT,
        env=child_env(**env),
        capture_output=True,
        text=True,
        timeout=HANG_S,
    )


def test_auto_says_which_cluster_it_joined(tmp_path: Path) -> None:
    address = ray.get_runtime_context().gcs_address
    done = command("ls", str(tmp_path), RAY_ADDRESS=address)  # --address auto
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"no checkpoints under {tmp_path}\n"  # stdout: the listing alone
    joined = f"air-transfer: joined the Ray cluster at {address} (found by --address auto): "
    assert joined + "1 live node(s)" in done.stderr, done.stderr


def test_a_refused_token_is_named_as_such(tmp_path: Path) -> None:
    """The shared Ray runs with Ray's token authentication (its default for a new
    cluster); a command holding another token is told so, naming the address."""
    if os.environ.get("RAY_AUTH_MODE") != "token":
        pytest.skip("this Ray started its cluster without token authentication")
    address = ray.get_runtime_context().gcs_address
    done = command("ls", str(tmp_path), "--address", address, RAY_AUTH_TOKEN="0" * 32)
    assert done.returncode == 1
    assert (
        f"the Ray cluster at {address} (--address {address}) refused this command's "
        "authentication token" in done.stderr
    ), done.stderr
    assert "RAY_AUTH_TOKEN" in done.stderr and "no running Ray cluster" not in done.stderr


def test_durable_secret_is_hidden_in_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root no agent drains: the error names the URI, its secret hidden."""
    uri = "s3://AKIAKEY:TOPSECRET@bucket/runs?endpoint_override=127.0.0.1:1"
    assert main(["ls", str(tmp_path), "--durable", uri]) == 1
    err = capsys.readouterr().err
    assert "--durable s3://AKIAKEY:***@bucket/runs" in err, err
    assert "TOPSECRET" not in err
