"""Every code block of the documentation runs (``tests.support.docs_blocks`` says
how: the substitutions for the reader's machine, the snippets a fragment names, the
rare block marked as one that cannot run here), on the shared two-node cluster with
moto's S3 server as ``s3://my-bucket``: Python blocks in this process, each in a
namespace of its own; bash blocks line by line in a shell, the ``air-transfer``
command joining the cluster (``RAY_ADDRESS``), installs checked against the README's
install block and the package's extras (CI runs those in fresh environments)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tomllib
from ray.cluster_utils import Cluster

from tests.support.docs_blocks import Block, blocks, inside, is_install, localized
from tests.support.docs_snippets import SNIPPETS
from tests.support.procs import REPO_ROOT, child_env
from tests.support.s3 import S3Server, bucket_server

BLOCKS = blocks()
#: Pages whose blocks another change rewrites: each must fail until then (strict).
PENDING: dict[str, str] = {}
README = (Path(REPO_ROOT) / "README.md").read_text()
EXTRAS = tomllib.loads((Path(REPO_ROOT) / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "my-bucket")


def test_the_docs_have_blocks_and_every_marker_names_what_exists() -> None:
    assert len(BLOCKS) >= 15
    for block in BLOCKS:
        assert set(block.marker) <= {"with", "then", "inside", "skip"}, block.id
        for name in [*block.snippets_before, *block.snippets_after, block.marker.get("inside")]:
            assert name is None or name in SNIPPETS, (block.id, name)
    skipped = [b.id for b in BLOCKS if "skip" in b.marker]
    assert len(skipped) <= 2, skipped  # the rare exception, each with its reason


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_each_block_runs(
    block: Block,
    cluster: Cluster,
    s3: S3Server,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if "skip" in block.marker:
        pytest.skip(block.marker["skip"])
    if block.page in PENDING:
        request.applymarker(pytest.mark.xfail(reason=PENDING[block.page], strict=True))
    for where in ("mnt/checkpoints", "mnt/ckpt"):
        (tmp_path / where).mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__docs__"}
    for name in block.snippets_before:
        run_python(SNIPPETS[name], f"<{name}>", namespace, tmp_path, s3, block.lang)
    if block.lang == "python":
        code = block.code
        if "inside" in block.marker:
            code = inside(SNIPPETS[block.marker["inside"]], code)
        run_python(code, block.id, namespace, tmp_path, s3, block.lang)
    else:
        run_bash(block, namespace.get("DOCS_ENV", {}), cluster.address, tmp_path, s3)
    for name in block.snippets_after:
        run_python(SNIPPETS[name], f"<{name}>", namespace, tmp_path, s3, block.lang)


def run_python(
    code: str, name: str, namespace: dict[str, Any], tmp: Path, s3: S3Server, lang: str
) -> None:
    exec(compile(localized(code, tmp, s3.uri), name, "exec"), namespace)


def run_bash(block: Block, env: dict[str, str], address: str, tmp: Path, s3: S3Server) -> None:
    """Each line: an install checked, anything else run in a shell (``set -e``)."""

    def quoted(bucket: str, prefix: str) -> str:
        return shlex.quote(s3.uri(bucket, prefix))

    text = re.sub(r"\\\n\s*", " ", block.code)
    lines = [x for x in text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    script = []
    for line in lines:
        if is_install(line):
            check_install(line, block.id)
        else:
            script.append(localized(line, tmp, quoted))
    if not script:
        return
    bin_dir = str(Path(sys.executable).parent)  # the air-transfer command
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-e", "-c", "\n".join(script)],
        cwd=tmp,
        env=child_env(RAY_ADDRESS=address, PATH=path, **env),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, f"{block.id}: exit {done.returncode}\n{done.stderr[-4000:]}"


def check_install(line: str, where: str) -> None:
    """An install line: the README's own (CI runs its install block in a fresh
    environment), or ``pip install`` of the clone with extras the package has."""
    words = shlex.split(line, comments=True)
    if words[:2] == ["git", "clone"] or words[:1] == ["cd"]:
        assert " ".join(words) in README, (where, line)
        return
    assert words[:2] == ["pip", "install"] and len(words) == 3, (where, line)
    target = re.fullmatch(r"\.(?:\[([\w,]+)\])?", words[2])
    assert target is not None, (where, line)
    extras = (target.group(1) or "").split(",")
    assert all(e in EXTRAS for e in extras if e), (where, line)
