"""Every code block of the documentation runs, none skipped (``tests.support.docs_blocks``
says how: the substitutions for the reader's machine, the snippets a fragment names,
the files a block runs), on a two-node cluster like the suite's shared one whose head
also runs Ray's dashboard (``ray job submit`` sends the page's own ``train.py`` to its
job server, ``ray list actors`` asks its State API), with moto's S3 server as
``s3://my-bucket``: Python blocks in this process, each in a namespace of its own;
bash blocks line by line in a shell, the ``air-transfer`` command joining the cluster
(``RAY_ADDRESS``), installs checked against the README's install block and the
package's extras (CI runs those in fresh environments)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import tomllib
from ray.cluster_utils import Cluster

from tests.support.cluster import SHARED_NODES, WORKER_RESOURCES, start_cluster
from tests.support.docs_blocks import (
    DASHBOARD,
    Block,
    blocks,
    inside,
    is_install,
    localized,
    page_file,
)
from tests.support.docs_snippets import SNIPPETS
from tests.support.procs import REPO_ROOT, child_env
from tests.support.s3 import S3Server, bucket_server

#: The cluster is this module's own: the shared one without a dashboard is stopped
#: first, so it runs after the modules sharing that one (tests/conftest.py).
pytestmark = pytest.mark.own_ray
BLOCKS = blocks()
#: Blocks that a block of their page runs as a file (``files=``: the deploy page's
#: ``train.py``, sent by ``ray job submit``), run there rather than on their own.
AS_FILES = {(b.page, name) for b in BLOCKS for name in b.files}
RUN_ALONE = [b for b in BLOCKS if (b.page, b.file_name) not in AS_FILES]
#: Pages whose blocks another change rewrites: each must fail until then (strict).
PENDING: dict[str, str] = {}
README = (Path(REPO_ROOT) / "README.md").read_text()
EXTRAS = tomllib.loads((Path(REPO_ROOT) / "pyproject.toml").read_text())["project"][
    "optional-dependencies"
]


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """The shared cluster's nodes (head, ``node_a``, ``node_b``), the head also
    running Ray's dashboard: the job server and the State API that the deploy and
    agents pages' commands talk to. Ended with the module.

    Its Ray temp directory is its own: the job server starts a job's driver with the
    address of the cluster last started in that directory (``ray_current_cluster``),
    which in a directory shared with other Rays on the machine may be another's."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_TMPDIR", tempfile.mkdtemp(prefix="ray-docs-"))
        cluster = start_cluster(*SHARED_NODES, node_resources=WORKER_RESOURCES, dashboard=True)
        yield cluster
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(os.environ["RAY_TMPDIR"], ignore_errors=True)


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    yield from bucket_server(tmp_path_factory.mktemp("moto"), "my-bucket")


def test_the_docs_have_blocks_none_skipped_and_every_marker_names_what_exists() -> None:
    assert len(BLOCKS) >= 15
    skipped = [b.id for b in BLOCKS if "skip" in b.marker]
    assert skipped == [], f"every block runs; these are marked skip: {skipped}"
    for block in BLOCKS:
        assert set(block.marker) <= {"with", "then", "inside", "files"}, block.id
        for name in [*block.snippets_before, *block.snippets_after, block.marker.get("inside")]:
            assert name is None or name in SNIPPETS, (block.id, name)
        for name in block.files:
            page_file(BLOCKS, block.page, name)


@pytest.mark.parametrize("block", RUN_ALONE, ids=[b.id for b in RUN_ALONE])
def test_each_block_runs(
    block: Block,
    cluster: Cluster,
    s3: S3Server,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
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
        dashboard = f"http://{cluster.webui_url}"
        for name in block.files:
            file = page_file(BLOCKS, block.page, name)
            code = "".join(SNIPPETS[n] for n in file.snippets_before) + file.code
            (tmp_path / name).write_text(localized(code, tmp_path, s3.uri, dashboard))
        env = namespace.get("DOCS_ENV", {})
        namespace["DOCS_STDOUT"] = run_bash(block, env, cluster.address, dashboard, tmp_path, s3)
    for name in block.snippets_after:
        run_python(SNIPPETS[name], f"<{name}>", namespace, tmp_path, s3, block.lang)


def run_python(
    code: str, name: str, namespace: dict[str, Any], tmp: Path, s3: S3Server, lang: str
) -> None:
    exec(compile(localized(code, tmp, s3.uri), name, "exec"), namespace)


def run_bash(
    block: Block, env: dict[str, str], address: str, dashboard: str, tmp: Path, s3: S3Server
) -> str:
    """Each line: an install checked, anything else run in a shell (``set -e``);
    what it printed. The shell finds the cluster as a reader's would: by
    ``RAY_ADDRESS``, or by the dashboard's address where the block gives one (then
    without ``RAY_ADDRESS``, which Ray's job client would take instead); never by the
    suite's ``RAY_API_SERVER_ADDRESS`` (tests/conftest.py), which overrides both."""

    def quoted(bucket: str, prefix: str) -> str:
        return shlex.quote(s3.uri(bucket, prefix))

    text = re.sub(r"\\\n\s*", " ", block.code)
    lines = [x for x in text.splitlines() if x.strip() and not x.lstrip().startswith("#")]
    script = []
    for line in lines:
        if is_install(line):
            check_install(line, block.id)
        else:
            script.append(localized(line, tmp, quoted, dashboard))
    if not script:
        return ""
    bin_dir = str(Path(sys.executable).parent)  # the air-transfer and ray commands
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    shell_env = child_env(PATH=path, **env)
    shell_env.pop("RAY_API_SERVER_ADDRESS", None)
    if DASHBOARD not in block.code:
        shell_env["RAY_ADDRESS"] = address
    done = subprocess.run(
        ["bash", "-e", "-c", "\n".join(script)],
        cwd=tmp,
        env=shell_env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    said = f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert done.returncode == 0, f"{block.id}: exit {done.returncode}\n{said}"
    return done.stdout


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
