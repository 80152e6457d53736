"""The two rules every change of node storage obeys (``storage.server.changes``),
applied by the agent around every call a Protocol declares a ``change``: fenced by
its ``op``, then the drain of its ``root`` woken. No method writes them, so a new
change has both by construction, and a call that takes an ``op`` without being
declared a change is refused when the agent starts."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Protocol

import pytest

from air_transfer.cluster.rpc import Services, declared_calls
from air_transfer.storage.durable.tombstones import MemoryTombstones
from air_transfer.storage.node_api import NodeMetadata, change, is_change
from air_transfer.storage.server.changes import ChangeRules
from air_transfer.storage.server.drain.tiered import TieredDisk
from air_transfer.storage.server.metadata import DiskStorage
from air_transfer.storage.server.node_service import NodeStorageService
from air_transfer.storage.server.op_fence import OpFence
from air_transfer.storage.server.stream_uploads import StreamUploads
from air_transfer.storage.server.uploads import DiskUploads
from tests.support.drains import SMALL, drained, local_target
from tests.support.waiting import eventually


class _NewCalls(Protocol):
    @change
    def fs_mark(self, root: str, path: str, op: str = "") -> None: ...

    def fs_peek(self, root: str) -> int: ...


class _New(_NewCalls):
    """A new service whose change writes neither rule."""

    def __init__(self) -> None:
        self.marked: list[str] = []

    def fs_mark(self, root: str, path: str, op: str = "") -> None:
        if path == "bad":
            raise OSError("failed half way")
        self.marked.append(path)

    def fs_peek(self, root: str) -> int:
        return len(self.marked)


def _hosted(*services: object) -> tuple[Services, OpFence, list[str]]:
    fence, woken = OpFence(), []
    return Services(*services, around=ChangeRules(fence, woken.append).around), fence, woken


def test_a_new_change_is_fenced_and_wakes_the_drain_though_it_writes_neither() -> None:
    service = _New()
    services, fence, woken = _hosted(service)
    services.call(_NewCalls.fs_mark, "/r", "a")
    services.call(_NewCalls.fs_mark, root="/r2", path="b", op="op-1")
    with pytest.raises(OSError, match="half way"):
        services.call(_NewCalls.fs_mark, "/r3", "bad")
    assert services.call(_NewCalls.fs_peek, "/r") == 2  # not a change: nothing woken
    assert woken == ["/r", "/r2", "/r3"]  # a change that failed may have changed a part
    assert fence.fence(["op-2"], 0) == []
    with pytest.raises(PermissionError, match="arrived late"):
        services.call(_NewCalls.fs_mark, "/r", "c", "op-2")
    assert service.marked == ["a", "b"]


def test_a_call_that_takes_an_op_without_being_a_change_is_refused() -> None:
    class Forgot(Protocol):
        def fs_mark(self, root: str, path: str, op: str = "") -> None: ...

    class Forgetful(Forgot):
        def fs_mark(self, root: str, path: str, op: str = "") -> None:
            pass

    class Rootless(Protocol):
        @change
        def mark(self, path: str) -> None: ...

    class NoRoot(Rootless):
        def mark(self, path: str) -> None:
            pass

    with pytest.raises(TypeError, match="takes an op: declare it a change"):
        _hosted(Forgetful())
    with pytest.raises(TypeError, match="a change of no root"):
        _hosted(NoRoot())


def test_node_storage_declares_its_changes() -> None:
    """Every call of node storage that changes a root is declared one (and passes
    the rules' checks); none that only reads is."""
    declared = [
        (name, method)
        for cls in (NodeStorageService, DiskUploads, TieredDisk, StreamUploads)
        for name, method in declared_calls(cls)
    ]
    rules = ChangeRules(OpFence(), lambda root: None)
    for _, method in declared:
        rules.around(method, lambda: None)
    assert {name for name, method in declared if is_change(method)} == {
        "fs_create_dir",
        "fs_delete_dir",
        "fs_delete_dir_contents",
        "fs_delete_file",
        "fs_move",
        "fs_copy_file",
        "fs_commit",
        "fs_commit_indexed",
        "store_report",
        "store_incremental",
        "note_report_dir",
        "reclaim_reports",
        "reclaim_placed_reports",
        "fs_swap_stub",
    }


def test_a_change_served_wakes_the_drain_before_its_rescan(tmp_path: Path) -> None:
    """Through the agent's rules, a directory made in node storage reaches the tier
    with no request, though the drain would not look again for an hour."""
    root = tmp_path / "root"
    root.mkdir()
    disk = TieredDisk(DiskStorage())
    settings = dataclasses.replace(SMALL, rescan_s=3600.0)
    disk.attach(str(root), local_target(tmp_path / "durable"), settings, None, MemoryTombstones())
    tier = disk.tier(str(root))
    assert tier is not None
    try:
        drained(tier.drainer)
        services = Services(disk, around=ChangeRules(OpFence(), disk.touch).around)
        services.call(NodeMetadata.fs_create_dir, str(root), f"{root}/run/new", True)
        eventually(lambda: (tmp_path / "durable" / "run" / "new").is_dir(), "the new directory")
    finally:
        disk.stop()
