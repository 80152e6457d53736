"""``storage.report_ledger``: what Ray Train's reports stored on the storage node,
by worker, and the reclaim of what a stopped worker group stored and Train does not
track (the checkpoint reported just before a worker failure, orphaned otherwise).
Threads, no Ray."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from air_transfer.storage.server.report_ledger import GroupStoppedError, ReportLedger


def publish(path: Path) -> Callable[[Callable[[], None]], str]:
    """A write of three chunks that publishes ``path`` only once they all passed."""

    def write(check: Callable[[], None]) -> str:
        for _ in range(3):
            check()
        path.mkdir()
        return str(path)

    return write


def rmdir(path: str) -> None:
    Path(path).rmdir()


def test_reclaim_deletes_what_a_stopped_group_stored_and_train_does_not_track(
    tmp_path: Path,
) -> None:
    ledger = ReportLedger()
    kept, orphan, other = tmp_path / "kept", tmp_path / "orphan", tmp_path / "other"
    ledger.store("w1", str(kept), publish(kept))
    ledger.store("w2", str(orphan), publish(orphan))
    ledger.store("w3", str(other), publish(other))
    pruned = tmp_path / "pruned"  # stored, then deleted by Train itself
    ledger.store("w1", str(pruned), publish(pruned))
    pruned.rmdir()
    assert ledger.reclaim(["w1", "w2"], [str(kept)], rmdir) == [str(orphan)]
    assert kept.is_dir() and not orphan.exists() and other.is_dir()  # w3: not stopped
    assert ledger.reclaim(["w1", "w2"], [], rmdir) == []  # their notes are gone


def test_a_store_of_a_stopped_group_is_refused(tmp_path: Path) -> None:
    ledger = ReportLedger()
    ledger.reclaim(["w1"], [], rmdir)
    with pytest.raises(GroupStoppedError, match="w1"):
        ledger.store("w1", str(tmp_path / "late"), publish(tmp_path / "late"))
    assert not (tmp_path / "late").exists()
    ledger.store("w2", str(tmp_path / "new"), publish(tmp_path / "new"))  # a new group's
    assert (tmp_path / "new").is_dir()


def test_reclaim_ends_a_store_still_running_and_waits_for_it(tmp_path: Path) -> None:
    """Whichever comes first, the store's last chunk or the reclaim, nothing the
    stopped worker stored remains: the store stops at its next chunk, or what it
    published is deleted once it ends (the reclaim waits for it)."""
    ledger = ReportLedger()
    target = tmp_path / "running"
    inside, go = threading.Event(), threading.Event()
    outcome: list[BaseException | str] = []

    def write(check: Callable[[], None]) -> str:
        check()
        inside.set()
        go.wait(timeout=30)
        check()  # the next chunk
        target.mkdir()
        return str(target)

    def run() -> None:
        try:
            outcome.append(ledger.store("w1", str(target), write))
        except GroupStoppedError as e:
            outcome.append(e)

    thread = threading.Thread(target=run)
    thread.start()
    assert inside.wait(timeout=30)
    reclaimed: list[list[str]] = []
    reclaimer = threading.Thread(target=lambda: reclaimed.append(ledger.reclaim(["w1"], [], rmdir)))
    reclaimer.start()
    go.set()
    reclaimer.join(timeout=30)
    thread.join(timeout=30)
    assert not target.exists()
    assert len(outcome) == 1 and reclaimed
    if isinstance(outcome[0], GroupStoppedError):
        assert reclaimed == [[]]  # stopped before it published
    else:
        assert reclaimed == [[str(target)]]  # published first, then deleted
