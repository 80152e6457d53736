"""Writes to a storage with K copies: each lands on K distinct nodes, bit-identical,
every kind of change on each; bad replica settings are refused clearly."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer import storage_filesystem
from air_transfer.storage.server.replica_marker import Marker, write_marker
from tests.support.cluster import node_ids
from tests.support.node_storage import BODY, CONFIG, read
from tests.support.replicas import copies_identical, replicated, view, workers

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)


@pytest.mark.parametrize("k", [2, 3])
def test_every_change_lands_on_k_distinct_nodes(cluster4: Cluster, tmp_path: Path, k: int) -> None:
    fs, h = replicated(tmp_path, k, workers()[0])
    copies, fresh, _ = view(h)
    assert len(copies) == k and sorted(copies) == fresh
    assert h.node_id in copies and len(set(copies.values())) == k

    fs.create_dir(f"{h.root}/run/a", recursive=True)
    with fs.open_output_stream(f"{h.root}/run/a/big") as out:  # four chunks, one partial
        out.write(BODY)
    with fs.open_output_stream(f"{h.root}/run/small") as out:
        out.write(b"x" * 10)
    with fs.open_append_stream(f"{h.root}/run/small") as out:
        out.write(b"y" * 5)
    fs.move(f"{h.root}/run/small", f"{h.root}/run/moved")
    fs.copy_file(f"{h.root}/run/moved", f"{h.root}/run/copied")
    with fs.open_output_stream(f"{h.root}/run/gone") as out:
        out.write(b"z")
    fs.delete_file(f"{h.root}/run/gone")

    expected = {
        "run": None,
        "run/a": None,
        "run/a/big": BODY,
        "run/moved": b"x" * 10 + b"y" * 5,
        "run/copied": b"x" * 10 + b"y" * 5,
    }
    assert copies_identical(h, k) == expected
    assert read(fs, f"{h.root}/run/a/big") == BODY
    listed = fs.get_file_info(pafs.FileSelector(f"{h.root}/run", recursive=True))
    assert sorted(i.path for i in listed) == sorted(f"{h.root}/{p}" for p in expected if p != "run")

    fs.delete_dir(f"{h.root}/run/a")
    fs.delete_dir_contents(f"{h.root}/run")
    assert copies_identical(h, k) == {"run": None}


def test_copies_on_the_nodes_named(cluster4: Cluster, tmp_path: Path) -> None:
    names = workers()
    _, h = replicated(tmp_path, 3, names[1], named=(names[2], "head"))
    copies, _, _ = view(h)
    ids = node_ids()
    assert set(copies) == {ids[names[1]], ids[names[2]], ids["head"]}


def test_a_copy_unpickled_elsewhere_uses_the_same_copies(cluster4: Cluster, tmp_path: Path) -> None:
    fs, h = replicated(tmp_path, 2, workers()[0])

    @ray.remote(num_cpus=0, resources={workers()[1]: 0.01})
    def write_and_read(remote_fs: pafs.FileSystem, path: str) -> bytes:
        with remote_fs.open_output_stream(path) as out:
            out.write(BODY)
        return read(remote_fs, path)

    assert ray.get(write_and_read.remote(fs, f"{h.root}/f")) == BODY
    assert copies_identical(h, 2) == {"f": BODY}


def test_bad_replica_settings_are_refused(cluster4: Cluster, tmp_path: Path) -> None:
    node = node_ids()[workers()[0]]
    with pytest.raises(ValueError, match="replicas must be an int >= 1"):
        storage_filesystem(node=node, config=CONFIG, root=str(tmp_path), replicas=0)
    with pytest.raises(
        ValueError, match="replicas=9 needs 9 distinct live nodes; this cluster has 4"
    ):
        storage_filesystem(node=node, config=CONFIG, root=str(tmp_path), replicas=9)
    with pytest.raises(ValueError, match="is not a live node"):
        storage_filesystem(
            node=node, config=CONFIG, root=str(tmp_path), replicas=2, replica_nodes=("ab" * 28,)
        )
    with pytest.raises(ValueError, match="node must be a Ray node id"):
        storage_filesystem(
            node=node, config=CONFIG, root=str(tmp_path), replicas=2, replica_nodes=("nope",)
        )
    with pytest.raises(ValueError, match="must be distinct"):
        storage_filesystem(
            node=node, config=CONFIG, root=str(tmp_path), replicas=2, replica_nodes=(node,)
        )
    with pytest.raises(ValueError, match="replica_root must be absolute"):
        storage_filesystem(
            node=node, config=CONFIG, root=str(tmp_path), replicas=2, replica_root="rel/{node_id}"
        )


@ray.remote(num_cpus=0)
def read_here(fs: pafs.FileSystem, path: str) -> bytes:
    return read(fs, path)


def test_reads_take_the_local_copy_else_the_one_read_order_names(
    cluster4: Cluster, tmp_path: Path
) -> None:
    from air_transfer.storage.client import replica_set
    from tests.support.node_storage import read_counters

    w = workers()
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    with fs.open_output_stream(f"{h.root}/f") as out:
        out.write(BODY)

    def served() -> dict[str, int]:
        return {n: read_counters(n)["bytes_served"] for n in (w[0], w[1])}

    before = served()
    assert (
        ray.get(read_here.options(num_cpus=0, resources={w[1]: 0.01}).remote(fs, f"{h.root}/f"))
        == BODY
    )
    assert served() == before  # its own disk: no agent served a byte
    copies, fresh, _ = view(h)
    ids, names = node_ids(), {v: k for k, v in node_ids().items()}
    [(first, _), _] = replica_set.read_order(h.key, list(copies.items()), fresh, ids["head"])
    assert read(fs, f"{h.root}/f") == BODY  # from the head, which holds no copy
    after = served()
    assert after[names[first]] >= before[names[first]] + len(BODY)
    other = next(n for n in (w[0], w[1]) if n != names[first])
    assert after[other] == before[other]


def test_a_root_used_before_is_made_again_on_every_copy(cluster4: Cluster, tmp_path: Path) -> None:
    """Replicas turned on over a storage root that holds files (an earlier run with
    one copy, or an earlier cluster), with something else left in a copy of an
    earlier cluster (its marker names a storage this cluster does not know): only
    the storage node's copy is fresh, and repair makes the other from it."""
    w = workers()
    ids = node_ids()
    (tmp_path / "copies" / ids[w[0]] / "run").mkdir(parents=True)
    (tmp_path / "copies" / ids[w[0]] / "run" / "kept").write_bytes(BODY)
    (tmp_path / "copies" / ids[w[1]]).mkdir()
    (tmp_path / "copies" / ids[w[1]] / "left").write_bytes(b"from an earlier cluster")
    fd = os.open(tmp_path / "copies" / ids[w[1]], os.O_RDONLY)
    write_marker(fd, Marker("gone:/old", "gone"))
    os.close(fd)
    fs, h = replicated(tmp_path, 2, w[0], named=(w[1],))
    assert view(h)[1] in ([ids[w[0]]], sorted([ids[w[0]], ids[w[1]]]))  # or repaired already
    assert copies_identical(h, 2) == {"run": None, "run/kept": BODY}
    assert (
        ray.get(
            read_here.options(num_cpus=0, resources={w[1]: 0.01}).remote(fs, f"{h.root}/run/kept")
        )
        == BODY
    )
