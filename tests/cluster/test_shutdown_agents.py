"""``shutdown_agents()`` on a cluster of several nodes: it ends every node's agent
and the replica registry, both detached (they outlive the job that started them);
the files of node storage stay, and the next call starts what it needs again (the
registry from the record it saved in Ray's GCS)."""

from __future__ import annotations

from pathlib import Path

import pytest
import ray

from air_transfer import shutdown_agents
from air_transfer.cluster.nodes import NAMESPACE, REGISTRY_NAME, agent_name
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.replicas import replicated

pytestmark = pytest.mark.usefixtures("cluster")


def running(name: str) -> bool:
    try:
        ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return False
    return True


def test_shutdown_ends_every_agent_and_the_registry_and_keeps_the_files(tmp_path: Path) -> None:
    fs, handler = replicated(tmp_path, 2, "node_a")
    with fs.open_output_stream(f"{handler.root}/model.bin") as out:
        out.write(b"weights" * 1000)
    ids = node_ids()
    assert running(REGISTRY_NAME) and running(agent_name(ids["node_a"]))
    assert shutdown_agents() >= 2  # node_a's and its copy's
    assert not running(REGISTRY_NAME)
    assert not any(running(agent_name(node)) for node in ids.values())
    assert read(fs, f"{handler.root}/model.bin") == b"weights" * 1000
