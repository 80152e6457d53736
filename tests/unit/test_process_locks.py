"""Liveness of a process by the lock it holds for its life (``core.process_locks``),
without Ray: a child process holding its lock is alive, killed it is dead (its lock
file removed), one that exits normally removes its own; a lock of another lock
directory, and this process's own, are never judged dead. And node storage's upload
registry (``UploadWriters``) discards exactly the uploads of dead writers."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

from air_transfer.core import process_locks
from air_transfer.core.process_locks import LOCKS, ProcessLock
from air_transfer.storage.server.upload_writers import UploadWriters
from tests.support.procs import child_env

HOLDER = """
import sys
from air_transfer.core import process_locks
lock = process_locks.hold()
print(lock.directory[0], lock.directory[1], lock.name, flush=True)
sys.stdin.read()  # until the test closes it (or kills this process)
"""


def holder() -> tuple[subprocess.Popen[str], ProcessLock]:
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=child_env(),
    )
    assert child.stdout is not None
    dev, ino, name = child.stdout.readline().split()
    return child, ProcessLock((int(dev), int(ino)), name)


def test_a_process_holding_its_lock_is_alive_and_dead_once_killed() -> None:
    child, lock = holder()
    try:
        assert process_locks.dead([lock]) == []
        assert process_locks.dead([lock]) == []  # judging it did not take it away
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert process_locks.dead([lock]) == [lock]
    assert not os.path.exists(os.path.join(LOCKS, lock.name))  # removed once judged
    assert process_locks.dead([lock]) == [lock]  # and gone is dead


def test_a_normal_exit_removes_its_lock_file() -> None:
    child, lock = holder()
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait() == 0
    assert not os.path.exists(os.path.join(LOCKS, lock.name))


def test_what_cannot_be_judged_is_never_dead(tmp_path: Path) -> None:
    """This process's own lock, and one held under another lock directory (another
    container's ``/tmp``): nothing tells, so they are taken for alive."""
    own = process_locks.hold()
    assert process_locks.hold() == own  # one per process
    elsewhere = dataclasses.replace(own, directory=(-1, -1), name="0" * 32 + ".lock")
    assert process_locks.dead([own, elsewhere]) == []
    assert os.path.exists(os.path.join(LOCKS, own.name))


def test_only_the_uploads_of_dead_writers_are_discarded() -> None:
    discarded: list[tuple[str, str]] = []
    asked: list[set[str]] = []

    def dead(writers: set[str]) -> set[str]:
        asked.append(writers)
        return writers & {"killed"}

    uploads: UploadWriters[str] = UploadWriters(
        dead, lambda root, staging: discarded.append((root, staging)), period_s=3600
    )
    uploads.begin("/r", "/r/.a.air-upload-1", "killed")
    uploads.begin("/r", "/r/.b.air-upload-2", "alive")
    uploads.begin("/r", "/r/.c.air-upload-3", None)  # nobody to judge: not noted
    uploads.begin("/r", "/r/.d.air-upload-4", "killed")
    uploads.end("/r/.d.air-upload-4")  # committed before its writer died
    assert uploads.reap() == ["/r/.a.air-upload-1"]
    assert discarded == [("/r", "/r/.a.air-upload-1")] and asked == [{"killed", "alive"}]
    assert uploads.writing() == 1 and uploads.reaped == 1
    assert uploads.reap() == [] and len(discarded) == 1
