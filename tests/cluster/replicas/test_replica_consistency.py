"""Fresh copies never disagree, whatever races and whatever dies: a change caught
half applied (done on one copy, held at a gate on the other) is waited for by every
change of an overlapping path, and one whose caller was SIGKILLed between its
commits is resolved as soon as Ray knows of the death (the copies made to agree, the
staging file removed, the path free, repair not held back). Each test first checks
on disk that the race happened: one copy changed, the other not yet."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer import node_agent
from air_transfer.storage.client.replica_set import registry
from tests.support import agent_hooks
from tests.support.checkpoints import MiB, on
from tests.support.gates import Gate
from tests.support.node_storage import read
from tests.support.replicas import copies_identical, replicated, tree, view, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


def write(fs: Any, path: str, body: bytes) -> None:
    with fs.open_output_stream(path) as out:
        out.write(body)


def started(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def waits_or_ends(h: Any, thread: threading.Thread) -> None:
    """Until ``thread``'s change ended, or waits in the registry for its path."""
    eventually(
        lambda: not thread.is_alive() or ray.get(registry().waiting.remote(h.key)) > 0,
        "the racing change waiting or done",
    )


def test_copy_file_racing_a_rewrite_of_its_source(cluster4: Cluster, tmp_path: Path) -> None:
    fs, h = replicated(tmp_path, 2, workers()[0], named=(workers()[1],))
    write(fs, f"{h.root}/src", b"v1" * 1000)
    roots = view(h)[0]
    first, last = sorted(roots)  # a commit goes to the copies in this order
    gate = Gate.options(**on("head")).remote()
    agent_hooks.hold(last, "_uploads", "fs_commit", gate, match=f"{roots[last]}/src")
    try:
        rewrite = started(lambda: write(fs, f"{h.root}/src", b"v2" * 1000))
        ray.get(gate.wait_for_arrivals.remote(1))
        # The race: the rewrite is committed on one copy and not yet on the other.
        assert tree(roots[first])["src"] == b"v2" * 1000
        assert tree(roots[last])["src"] == b"v1" * 1000
        copy = started(lambda: fs.copy_file(f"{h.root}/src", f"{h.root}/dest"))
        waits_or_ends(h, copy)
        gate.open.remote()
        rewrite.join(60)
        copy.join(60)
    finally:
        agent_hooks.release(last, "_uploads", "fs_commit")
    assert not rewrite.is_alive() and not copy.is_alive()
    stored = copies_identical(h, 2)  # byte for byte on both copies
    assert stored == {"src": b"v2" * 1000, "dest": b"v2" * 1000}


def test_create_dir_racing_delete_dir_of_its_parent(cluster4: Cluster, tmp_path: Path) -> None:
    fs, h = replicated(tmp_path, 2, workers()[0], named=(workers()[1],))
    fs.create_dir(f"{h.root}/d/old", recursive=True)
    roots = view(h)[0]
    held = max(roots)
    gate = Gate.options(**on("head")).remote()
    agent_hooks.hold(held, "_disk", "fs_delete_dir", gate, match=f"{roots[held]}/d")
    try:
        delete = started(lambda: fs.delete_dir(f"{h.root}/d"))
        ray.get(gate.wait_for_arrivals.remote(1))
        other = min(roots)
        eventually(lambda: "d" not in tree(roots[other]), "d deleted on the other copy")
        assert "d/old" in tree(roots[held])  # the race: deleted on one copy only
        create = started(lambda: fs.create_dir(f"{h.root}/d/x", recursive=True))
        waits_or_ends(h, create)
        gate.open.remote()
        delete.join(60)
        create.join(60)
    finally:
        agent_hooks.release(held, "_disk", "fs_delete_dir")
    assert not delete.is_alive() and not create.is_alive()
    assert copies_identical(h, 2) == {"d": None, "d/x": None}


@ray.remote(num_cpus=0)
class Writer:
    """A process that writes into the storage, and is SIGKILLed mid-commit."""

    def pid(self) -> int:
        return os.getpid()

    def write(self, fs: Any, path: str, body: bytes) -> None:
        write(fs, path, body)


def kill_mid_commit(fs: Any, h: Any, held: str, name: str, body: bytes) -> None:
    """A writer process commits ``body`` at ``name`` on every copy before ``held``
    (in commit order), and is SIGKILLed while ``held``'s commit waits at a gate;
    that commit never lands (the call is dropped)."""
    gate = Gate.options(**on("head")).remote()
    where = f"{view(h)[0][held]}/{name}"
    agent_hooks.hold(held, "_uploads", "fs_commit", gate, match=where, drop=True)
    try:
        writer = Writer.options(**on("head")).remote()
        pid = ray.get(writer.pid.remote())
        writer.write.remote(fs, f"{h.root}/{name}", body)
        ray.get(gate.wait_for_arrivals.remote(1))
        os.kill(pid, signal.SIGKILL)
        psutil.wait_procs([psutil.Process(pid)], timeout=30)
        gate.open.remote()
    finally:
        agent_hooks.release(held, "_uploads", "fs_commit")


def in_flight(h: Any) -> list[Any]:
    return [op for op in ray.get(registry().in_flight.remote()) if op[0] == h.key]


def staging_left(roots: dict[str, str]) -> list[str]:
    return [p for r in roots.values() for p in tree(r) if ".air-upload-" in p]


def test_a_writer_killed_between_its_commits(cluster4: Cluster, tmp_path: Path) -> None:
    fs, h = replicated(tmp_path, 2, workers()[0], named=(workers()[1],))
    write(fs, f"{h.root}/f", b"v1" * MiB)
    roots = view(h)[0]
    first, last = sorted(roots)
    kill_mid_commit(fs, h, last, "f", b"v2" * MiB)
    # The race: v2 on one copy, v1 and the dead writer's staging file on the other.
    assert tree(roots[first])["f"] == b"v2" * MiB and tree(roots[last])["f"] == b"v1" * MiB
    assert staging_left({last: roots[last]})
    stored = copies_identical(h, 2)  # made to agree, both fresh
    assert stored["f"] in (b"v1" * MiB, b"v2" * MiB) and not staging_left(roots)
    eventually(lambda: not in_flight(h), "the path free")
    done = started(lambda: write(fs, f"{h.root}/f", b"v3"))
    done.join(30)
    assert not done.is_alive() and read(fs, f"{h.root}/f") == b"v3"
    assert copies_identical(h, 2) == {"f": b"v3"}


def test_a_dead_writer_does_not_hold_repair_back(cluster4: Cluster, tmp_path: Path) -> None:
    w = workers()
    fs, h = replicated(tmp_path, 3, w[0], named=(w[1], w[2]))
    write(fs, f"{h.root}/f", b"v1")
    roots = view(h)[0]
    order = sorted(roots)
    kill_mid_commit(fs, h, order[2], "f", b"v2")
    # Meanwhile another copy goes stale: its agent is killed mid-write of g.
    with fs.open_output_stream(f"{h.root}/g") as out:
        out.write(b"g" * MiB)
        ray.kill(node_agent(order[1]))
        out.write(b"g" * MiB)
    assert order[1] not in view(h)[1]
    # Repaired while the dead writer's commit would still hold its path (5 minutes).
    stored = copies_identical(h, 3)
    assert stored["g"] == b"g" * 2 * MiB and stored["f"] in (b"v1", b"v2")
    assert not staging_left(roots)
