"""``placement="writer"`` keeps K holders by itself: when Ray says a holder's node will
go (draining, as the autoscaler and a preemption notice say it, with a deadline) its
placed files are copied to nodes that stay before it goes, and when a holder's node
is lost the files get K live holders again, both with no call by the user (the
replica registry's background pass); a write racing the evacuation keeps one whole
version, its own, and leaves no other bytes behind."""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import pytest
import ray
from ray.cluster_utils import Cluster

from air_transfer.storage.client.writer_placed import WriterPlacedHandler
from air_transfer.storage.placed_record import PlacedRecord
from tests.cluster.replicas.test_replica_draining import _drain
from tests.cluster.replicas.test_writer_placement import blobs, fs_of, placed, write
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.node_storage import read
from tests.support.replicas import remove, top_up, workers
from tests.support.waiting import eventually

pytestmark = pytest.mark.own_ray  # a Ray of its own (tests/conftest.py: the order)

K = 2


def write_all(h: WriterPlacedHandler, files: dict[str, bytes], node: str) -> None:
    """``files`` (relative paths) written by a process on ``node`` (a resource name)."""
    fs = fs_of(h)
    for d in sorted({rel.rsplit("/", 1)[0] for rel in files}):
        fs.create_dir(f"{h.root}/{d}")
    refs = [write.options(**on(node)).remote(fs, f"{h.root}/{r}", d) for r, d in files.items()]
    ray.get(refs)


def records(h: WriterPlacedHandler, files: dict[str, bytes]) -> dict[str, PlacedRecord]:
    found = {rel: h.record_of(f"{h.root}/{rel}") for rel in files}
    assert all(r is not None for r in found.values()), found
    return {rel: r for rel, r in found.items() if r is not None}


def held_by_staying(
    h: WriterPlacedHandler, files: dict[str, bytes], gone: str
) -> dict[str, PlacedRecord] | None:
    """Every file's record, once each names K live holders, none of them ``gone``."""
    live = set(node_ids().values()) - {gone}
    found = records(h, files)
    for record in found.values():
        nodes = {n for n, _ in record.holders}
        if len(nodes) != K or not nodes <= live:
            return None
    return found


def assert_whole(
    h: WriterPlacedHandler, files: dict[str, bytes], found: dict[str, PlacedRecord]
) -> None:
    """Every holder's blob of every file byte-identical to what was written."""
    for rel, record in found.items():
        for holder in record.holders:
            assert Path(record.where(holder)).read_bytes() == files[rel], (rel, holder[0])


def reads_back(h: WriterPlacedHandler, files: dict[str, bytes]) -> None:
    """Every file read through the storage byte-identical to what was written."""
    fs = fs_of(h)
    for rel, data in files.items():
        assert read(fs, f"{h.root}/{rel}") == data, rel


def files_of(tag: str, count: int) -> dict[str, bytes]:
    """``count`` placed files of two checkpoints (the second the newer)."""
    return {f"ckpt-{i % 2}/{tag}-{i}.bin": os.urandom(MiB + 4096 * i) for i in range(count)}


def test_a_draining_nodes_files_are_copied_off_before_its_deadline(
    cluster4: Cluster, tmp_path: Path
) -> None:
    w = workers()
    ids = node_ids()
    h = placed(tmp_path, "head", named=(w[0],))
    files = files_of("shard", 6)
    write_all(h, files, w[1])  # w[1] holds every file (its writer's node), one other too
    leaving = ids[w[1]]
    assert all(leaving in dict(r.holders) for r in records(h, files).values())
    deadline_ms = int((time.time() + 120) * 1000)
    _drain(leaving, 120)
    try:
        found = eventually(
            lambda: held_by_staying(h, files, leaving),
            lambda: f"K holders off {leaving[:12]}: {records(h, files)}",
            90,
        )
        assert time.time() * 1000 < deadline_ms  # before the node goes
        assert_whole(h, files, found)
    finally:
        remove(cluster4, leaving)  # it goes (a draining node takes no new task)
    assert held_by_staying(h, files, leaving) == found  # K holders outlived it
    reads_back(h, files)


def test_a_lost_holders_files_get_k_holders_again_with_no_call(
    cluster4: Cluster, tmp_path: Path
) -> None:
    w = workers()
    ids = node_ids()
    h = placed(tmp_path, "head", named=(w[0],))
    files = files_of("part", 4)
    write_all(h, files, w[1])
    lost = ids[w[1]]
    remove(cluster4, lost)
    found = eventually(
        lambda: held_by_staying(h, files, lost),
        lambda: f"K live holders without {lost[:12]}: {records(h, files)}",
        90,
    )
    assert_whole(h, files, found)
    reads_back(h, files)


def test_a_write_racing_the_evacuation_keeps_its_own_whole_version(
    cluster4: Cluster, tmp_path: Path
) -> None:
    top_up(cluster4, 4)
    w = workers()
    ids = node_ids()
    h = placed(tmp_path, "head", named=(w[0],))
    still = files_of("kept", 8)  # evacuated, never written again
    raced = "ckpt-1/raced.bin"
    write_all(h, {**still, raced: os.urandom(2 * MiB)}, w[1])
    leaving = ids[w[1]]
    _drain(leaving, 300)
    try:
        raced_while_evacuating(h, tmp_path, still, raced, leaving)
    finally:
        remove(cluster4, leaving)  # a draining node takes no new task


def raced_while_evacuating(
    h: WriterPlacedHandler, tmp: Path, still: dict[str, bytes], raced: str, leaving: str
) -> None:
    """``raced`` written again and again while ``still`` is evacuated off ``leaving``;
    then every file whole on K staying holders, and no other bytes left."""
    fs = fs_of(h)
    versions: list[bytes] = []
    during = 0  # writes started while the evacuation was still under way
    while held_by_staying(h, still, leaving) is None or not versions:
        if held_by_staying(h, still, leaving) is None:
            during += 1
        versions.append(os.urandom(2 * MiB + len(versions)))
        ray.get(write.options(**on("head")).remote(fs, f"{h.root}/{raced}", versions[-1]))
        assert len(versions) < 40, "the evacuation never ended"
    assert during > 0  # the race happened: a write went on during the evacuation
    final = {**still, raced: versions[-1]}
    found = eventually(
        lambda: held_by_staying(h, final, leaving),
        lambda: f"K holders off {leaving[:12]}: {records(h, final)}",
        90,
    )
    assert_whole(h, final, found)  # the last write's bytes, whole, on each holder
    assert read(fs, f"{h.root}/{raced}") == versions[-1]

    def only_named() -> Counter[bytes] | None:
        # No bytes of an earlier version, nor of a copy the evacuation made of one.
        held = Counter(data for datas in blobs(tmp).values() for data in datas)
        want = Counter({data: K for data in final.values()})
        return held if held == want else None

    eventually(
        only_named, lambda: f"blobs: {[len(b) for bs in blobs(tmp).values() for b in bs]}", 60
    )
