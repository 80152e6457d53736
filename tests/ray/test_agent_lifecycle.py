"""The node agents' lifecycle on the shared local Ray: an agent outlives the job that
started it, so one started by another air-transfer version is refused (never serves
this caller), one started with other settings is named in a warning, a new one runs
with the driver's ``AIR_TRANSFER_*`` settings, and ``shutdown_agents()`` frees what
they keep after a job."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray

from air_transfer import ChunkedCheckpoint, TransferConfig, node_agent, shutdown_agents
from air_transfer.cluster import _ray_core, identity
from air_transfer.cluster.agent_client import AgentClient
from air_transfer.cluster.nodes import NAMESPACE, agent_name
from air_transfer.core import environ
from air_transfer.storage.server.node_service import NodeStorageService
from air_transfer.transfer.relay import Relays
from tests.support.agents import OTHER_VERSION, OtherVersionAgent, PreIdentityAgent, start_as_agent
from tests.support.checkpoints import MiB, Producer, kill_and_wait, make_checkpoint
from tests.support.waiting import eventually

pytestmark = pytest.mark.usefixtures("ray_local")


@pytest.fixture
def here() -> Iterator[str]:
    """This node's id; no agent runs here before or after the test."""
    shutdown_agents()
    yield ray.get_runtime_context().get_node_id()
    shutdown_agents()


@pytest.mark.parametrize(
    ("cls", "theirs"),
    [(OtherVersionAgent, OTHER_VERSION), (PreIdentityAgent, "older than the identity check")],
    ids=["other-version", "before-versions"],
)
def test_an_agent_of_another_version_is_refused_until_shut_down(
    here: str, tmp_path: Path, cls: type, theirs: str
) -> None:
    """Defect: a detached agent left by another version served this caller with its
    own code. Every way in (the agent itself, a transfer) refuses it, naming both
    versions and the fix; after ``shutdown_agents()`` an agent of this version runs."""
    start_as_agent(cls, here)
    expected = re.escape(f"runs air-transfer {theirs}, this process {environ.package_version()}")
    with pytest.raises(RuntimeError, match=expected) as refused:
        node_agent(here)
    assert "shutdown_agents()" in str(refused.value)
    src = make_checkpoint(tmp_path / "src", 1 * MiB)
    with pytest.raises(RuntimeError, match=expected):
        ChunkedCheckpoint.from_directory(src).to_object_ref()
    assert shutdown_agents() == 1
    mine = ray.get(node_agent(here).identity.remote())
    assert mine.version == environ.package_version()


def test_a_new_agent_runs_with_the_drivers_settings(
    here: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect: an agent had the environment of the raylet that started its process,
    never the driver's settings."""
    monkeypatch.setenv(environ.REPAIR_MIB_S, "123")
    agent = node_agent(here)
    assert ray.get(agent.identity.remote()).settings[environ.REPAIR_MIB_S] == "123"


def test_a_caller_with_other_settings_is_told_the_agent_keeps_its_own(
    here: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(environ.PROGRESS, raising=False)
    agent = node_agent(here)  # started without the setting
    monkeypatch.setenv(environ.PROGRESS, "1")
    identity.forget()  # as a process that has not asked this agent yet
    with caplog.at_level(logging.WARNING, logger="air_transfer.cluster.identity"):
        assert identity.checked(agent, agent_name(here)) == agent
    assert f"{environ.PROGRESS}='1' here, '' there" in caplog.text
    assert "shutdown_agents()" in caplog.text


def test_shutdown_agents_frees_what_they_keep_after_a_job(here: str, tmp_path: Path) -> None:
    """A worker that died holding a checkpoint its node's agent packed
    (``owner="node"``) leaves it to the agent, as after a job: its chunks stay in
    the object store. ``shutdown_agents()`` returns once the agent is gone (its name
    free: the next call starts a new one), its process exits and the store is back
    where it was."""
    free = _ray_core.object_store_free_bytes(here)
    assert free is not None
    src = make_checkpoint(tmp_path / "src", 16 * MiB)
    producer = Producer.options(num_cpus=0).remote()
    config = TransferConfig(chunk_bytes=4 * MiB, strategy="chunked", owner="node")
    ray.get(producer.share.remote(str(src), config))
    kill_and_wait(producer)  # holding its ref: the agent keeps the checkpoint
    agent_pid = ray.get(node_agent(here).pid.remote())

    def held() -> bool:
        return (_ray_core.object_store_free_bytes(here) or 0) <= free - 16 * MiB

    eventually(held, "the dead worker's checkpoint to stay in the store")
    assert shutdown_agents() == 1
    with pytest.raises(ValueError):
        ray.get_actor(agent_name(here), namespace=NAMESPACE)
    eventually(lambda: not psutil.pid_exists(agent_pid), "the agent's process to exit")

    def freed() -> bool:
        return (_ray_core.object_store_free_bytes(here) or 0) >= free - 4 * MiB

    eventually(freed, "the agent's checkpoint to leave the store")


def test_the_agent_serves_only_the_calls_its_protocols_declare(here: str) -> None:
    """Defect: every public method of every service the agent hosts was callable,
    node storage's counters and cache included, though no Protocol declared them."""
    agent = AgentClient(here)
    assert ray.get(agent.call(Relays.waiting)) == 0  # declared: served
    for undeclared in (NodeStorageService.counters, NodeStorageService.clear_cache):
        with pytest.raises(TypeError, match="no service of this actor serves"):
            ray.get(agent.call(undeclared))
