"""Replica settings that could not keep K copies are refused when the filesystem is
made, with an error that says what to do, and nothing on disk is touched: a root of
'/', a copy's root holding files the storage did not write, copies sharing one
directory, copies nested inside the storage's root, fewer copies than the storage
is kept with; more copies are made if asked. A copy that cannot be made again is
given up on loudly (its state says why) and made on another node."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer import storage_filesystem
from air_transfer.storage.client.replica_set import registry
from tests.support.cluster import node_ids
from tests.support.node_storage import CONFIG
from tests.support.replicas import copies_identical, replicated, view, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


def test_roots_that_cannot_keep_copies_are_refused(cluster4: Cluster, tmp_path: Path) -> None:
    node, other = (node_ids()[w] for w in workers()[:2])
    with pytest.raises(ValueError, match=r"replicas=2 needs a dedicated root: root='/'"):
        storage_filesystem(node=node, config=CONFIG, replicas=2, root="/", expose_system_dirs=True)
    with pytest.raises(ValueError, match="replica_root='/' is a node's whole disk"):
        storage_filesystem(
            node=node, config=CONFIG, root=str(tmp_path / "s"), replicas=2, replica_root="/"
        )
    # A copy's root holding the user's files: refused, and nothing there is touched.
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_bytes(b"the user's")
    with pytest.raises(ValueError, match=r"holds files this storage did not write \('notes.txt'"):
        storage_filesystem(
            node=node,
            config=CONFIG,
            root=str(tmp_path / "s"),
            replicas=2,
            replica_nodes=(other,),
            replica_root=str(tmp_path / "mine"),
        )
    assert os.listdir(tmp_path / "mine") == ["notes.txt"]
    assert (tmp_path / "mine" / "notes.txt").read_bytes() == b"the user's"
    assert ray.get(registry().view.remote(f"{node}:{tmp_path / 's'}")) is None


def test_copies_sharing_a_directory_are_refused(cluster4: Cluster, tmp_path: Path) -> None:
    """The mock cluster's nodes share one disk, as nodes sharing an NFS mount do."""
    ids = node_ids()
    node, named = ids[workers()[0]], (ids[workers()[1]], ids[workers()[2]])
    root = tmp_path / "store"
    root.mkdir()
    (root / "kept").write_bytes(b"stored before")
    with pytest.raises(ValueError, match=r"are one directory, .*'/path/\{node_id\}'"):
        storage_filesystem(
            node=node, config=CONFIG, root=str(root), replicas=2, replica_nodes=named[:1]
        )
    with pytest.raises(ValueError, match="are one directory"):  # no {node_id}
        storage_filesystem(
            node=node,
            config=CONFIG,
            root=str(root),
            replicas=3,
            replica_nodes=named,
            replica_root=str(tmp_path / "copies"),
        )
    assert (root / "kept").read_bytes() == b"stored before"  # nothing lost
    assert ray.get(registry().view.remote(f"{node}:{root}")) is None


def test_settings_that_collide_are_refused_or_honoured(cluster4: Cluster, tmp_path: Path) -> None:
    node = node_ids()[workers()[0]]
    with pytest.raises(ValueError, match="lies inside root"):
        storage_filesystem(
            node=node,
            config=CONFIG,
            root=str(tmp_path / "s"),
            replicas=2,
            replica_root=str(tmp_path / "s" / "copies" / "{node_id}"),
        )
    fs, h = replicated(tmp_path, 2, workers()[0])
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(b"kept on two")
    again = dict(root=h.root, replica_root=h.replica_root)
    with pytest.raises(ValueError, match="replicas=1 would drop copies"):
        storage_filesystem(
            node=node, config=CONFIG, replicas=1, replica_nodes=(node_ids()["head"],), **again
        )
    with pytest.raises(ValueError, match="kept already with replica_root="):
        storage_filesystem(
            node=node,
            config=CONFIG,
            root=h.root,
            replicas=2,
            replica_root=str(tmp_path / "o/{node_id}"),
        )
    storage_filesystem(node=node, config=CONFIG, replicas=3, **again)  # honoured: a third copy
    assert view(h)[0].keys() >= {node} and ray.get(registry().view.remote(h.key))[3] == 3
    assert copies_identical(h, 3) == {"f": b"kept on two"}


def test_a_copy_that_cannot_be_made_again_is_given_up_loudly(
    cluster4: Cluster, tmp_path: Path
) -> None:
    from air_transfer import replica_status
    from air_transfer.storage.server.replica_record import MAX_ATTEMPTS

    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    broken = node_ids()[w[1]]
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(b"before")
    root = view(h)[0][broken]
    shutil.rmtree(root)
    Path(root).write_bytes(b"a file where the copy's root was")  # no repair can use it
    with fs.open_output_stream(f"{h.root}/g") as out:  # the broken copy misses it
        out.write(b"after")

    # Made on a node that had no copy instead: two fresh copies again...
    assert copies_identical(h, 2) == {"f": b"before", "g": b"after"}
    assert broken not in view(h)[1]
    # ...once repair gave up on the broken one, which its state says, and why.
    [state] = [s for s in replica_status(fs) if s.node_id == broken]
    assert state.state == "failed" and state.attempts == MAX_ATTEMPTS
    assert "FileExistsError" in (state.error or "") and root in (state.error or "")
