"""Many changes of one path at once, and a write racing the repair of a copy: the
registry never jams (a change waiting for its path holds none of the registry's
threads, so the holder's end and every other storage are still answered), and a
copy being re-made never fails a write."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer import node_agent
from air_transfer.storage.client.replica_set import registry
from tests.support import agent_hooks
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.gates import Gate
from tests.support.node_storage import CONFIG
from tests.support.replicas import copies_identical, replicated, tree, view, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

CALLERS = 40  # more than the registry's 32 threads


def test_forty_writers_of_one_path_at_once(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path / "a", 2, w[0], named=(w[1],))
    _, other = replicated(tmp_path / "b", 2, w[1], named=(w[2],))
    roots = view(h)[0]
    held = max(roots)
    gate = Gate.options(**on("head")).remote()
    agent_hooks.hold(held, "_uploads", "fs_commit", gate, match=f"{roots[held]}/one")
    bodies = [os.urandom(1000 + i) for i in range(CALLERS)]
    closing = threading.Semaphore(0)
    errors: list[BaseException] = []

    def writer(body: bytes) -> None:
        try:
            out = fs.open_output_stream(f"{h.root}/one")
            out.write(body)
            closing.release()
            out.close()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(b,), daemon=True) for b in bodies]
    try:
        for t in threads:
            t.start()
        for _ in threads:
            assert closing.acquire(timeout=120)
        ray.get(gate.wait_for_arrivals.remote(1))  # one commit holds the path...
        eventually(  # ...while every other writer waits for it
            lambda: ray.get(registry().waiting.remote(h.key)) == CALLERS - 1,
            lambda: f"{CALLERS - 1} waiting: {ray.get(registry().waiting.remote(h.key))}",
        )
        # Meanwhile the registry answers for another storage, and for this one.
        assert ray.get(registry().view.remote(other.key), timeout=20) is not None
        assert ray.get(registry().view.remote(h.key), timeout=20) is not None
        gate.open.remote()
        for t in threads:
            t.join(120)
    finally:
        agent_hooks.release(held, "_uploads", "fs_commit")
    assert not [t for t in threads if t.is_alive()] and errors == []
    stored = copies_identical(h, 2)
    assert stored["one"] in bodies and list(stored) == ["one"]


def test_a_write_survives_the_repair_of_a_copy_it_stages_on(
    cluster4: Cluster, tmp_path: Path
) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    source, syncing = node_ids()[w[0]], node_ids()[w[1]]
    big = os.urandom(3 * MiB)
    fs.create_dir(f"{h.root}/d")
    with fs.open_output_stream(f"{h.root}/d/big") as out:
        out.write(big)
    gate = Gate.options(**on("head")).remote()
    # Repair stops at its first read of d/big from the source, the copy syncing.
    agent_hooks.hold(source, "_files", "refs", gate, match="/d/big")
    try:
        with fs.open_output_stream(f"{h.root}/d/lost") as out:  # the copy goes stale
            out.write(b"x" * MiB)
            ray.kill(node_agent(syncing))
            out.write(b"x" * MiB)
        ray.get(gate.wait_for_arrivals.remote(1))
        assert view(h)[2] == [syncing]
        out = fs.open_output_stream(f"{h.root}/d/new")  # staged on the syncing copy too
        out.write(b"n" * 100)
        fs.create_dir(f"{h.root}/d")  # touched: repair copies d again, staging and all
        gate.open.remote()
        copy = view(h)[0][syncing]

        def staged_there() -> bool:
            return any("new" in p and ".air-upload-" in p for p in tree(copy))

        eventually(lambda: not staged_there(), "the syncing copy's d copied again")
        # More chunks than the window: the writer waits for the syncing copy's
        # writes into its staging file, which is gone.
        body = b"n" * 100 + os.urandom((CONFIG.window + 2) * CONFIG.chunk_bytes)
        out.write(body[100:])
        out.close()  # the write is stored: the syncing copy is not its answer
    finally:
        agent_hooks.release(source, "_files", "refs")
    stored = copies_identical(h, 2)
    assert stored["d/new"] == body and stored["d/big"] == big
