"""The attacker of the confinement tests: a thread that flips a path component of
the storage root between a directory and a symlink leading outside it, while calls
run, and what every call is allowed to do meanwhile."""

from __future__ import annotations

import errno
import os
import random
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from air_transfer.core.exchange import exchange
from air_transfer.storage.server.metadata import DiskStorage
from air_transfer.storage.server.uploads import DiskUploads

#: Calls per test: each flip lands somewhere in some of them.
ITERATIONS = 150
SIZE = 3000
INSIDE, SECRET = b"inside".ljust(SIZE, b"."), b"SECRET".ljust(SIZE, b".")
#: Only outside: no listing, scan or copy may ever show it.
PLANTED = "planted-outside"
CHUNK = 1024
#: How often the attacker and the caller may take turns (Python's default: 5 ms).
SWITCH_S = 1e-5


class Disk(DiskStorage, DiskUploads):
    """The disk services the node agent runs, minus the actor."""


@dataclass
class Attack:
    root: Path  # the storage root; root/d is the directory that flips
    outside: Path
    d: Path
    alt: Path  # what root/d is exchanged with: a symlink to outside, or d itself
    before: dict[str, Any] = field(default_factory=dict)
    flips: int = 0

    @property
    def r(self) -> str:
        return str(self.root)


def populate(top: Path, body: bytes) -> None:
    (top / "ckpt" / "sub").mkdir(parents=True)
    (top / "ckpt" / "a").write_bytes(body)
    (top / "ckpt" / "sub" / "b").write_bytes(body)
    (top / "f").write_bytes(body)
    (top / "exp").mkdir()


def state(top: Path) -> dict[str, Any]:
    """Every entry under ``top``: kind, mode, mtime (a directory's changes with every
    entry made, renamed or removed in it) and a file's bytes."""
    found: dict[str, Any] = {}
    for path in [top, *top.rglob("*")]:
        st = path.lstat()
        body = path.read_bytes() if path.is_file() and not path.is_symlink() else None
        found[str(path.relative_to(top))] = (st.st_mode, st.st_mtime_ns, body)
    return found


def make_attack(tmp_path: Path) -> Attack:
    root, outside = tmp_path / "root", tmp_path / "outside"
    populate(root / "d", INSIDE)
    populate(outside, SECRET)
    (outside / PLANTED).write_bytes(SECRET)
    (outside / "ckpt" / PLANTED).write_bytes(SECRET)
    (root / "alt").symlink_to(outside)
    a = Attack(root, outside, root / "d", root / "alt")
    a.before = state(outside)
    return a


class Attacker:
    """A thread that, during each call, exchanges ``root/d`` with the symlink
    ``root/alt`` (``root/d`` then leads outside) and back a moment later: at a random
    point of the call and for a random while, both counted in system calls of its
    own (not time), spread over how long the calls have lasted so far. So some calls
    see no flip, some one in any of their steps, some both flips."""

    def __init__(self, a: Attack) -> None:
        self.a, self.random = a, random.Random(0)
        self.go, self.done, self.idle = threading.Event(), threading.Event(), threading.Event()
        self.stopping = False
        self.span = 64  # system calls of the attacker during a call, a running average
        self.thread = threading.Thread(target=self._run, name="attacker", daemon=True)
        self.thread.start()

    def during(self, call: Callable[[], object]) -> None:
        """Run ``call`` while attacking; return once ``root/d`` is the directory again."""
        self.idle.clear()
        self.go.set()
        try:
            call()
        finally:
            self.done.set()
            self.idle.wait()

    def stop(self) -> None:
        self.stopping = True
        self.go.set()
        self.thread.join()

    def _flip(self) -> None:
        exchange(str(self.a.d), str(self.a.alt))

    def _run(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            if self.stopping:
                return
            start = self.random.randrange(self.span)
            end = start + self.random.randrange(1, self.span // 4 + 2)
            spins = 0
            while not self.done.is_set():
                if spins in (start, end):
                    self._flip()
                    self.a.flips += spins == start
                os.lstat(self.a.root)
                spins += 1
            if start < spins <= end:  # still leading outside: back
                self._flip()
            self.span = (self.span + spins) // 2 + 1
            self.done.clear()
            self.idle.set()


def outcome(call: Callable[[], object], unexpected: list[str]) -> str:
    """The outcome of ``call``: "ok", or the type of a clear error; anything else is
    recorded in ``unexpected``."""
    try:
        call()
        return "ok"
    except AssertionError:
        raise  # something outside was read
    except (PermissionError, FileNotFoundError, NotADirectoryError) as e:
        return type(e).__name__
    except OSError as e:
        if e.errno == errno.ELOOP:
            return "ELOOP"
        unexpected.append(repr(e))
    except Exception as e:
        unexpected.append(repr(e))
    return "unexpected"


def attacked(
    a: Attack, call: Callable[[int], object], iterations: int = ITERATIONS
) -> Counter[str]:
    """``call(i)`` for each i under attack; the outcomes. Fails if anything outside
    changed, or a call raised an error that is not a clear refusal."""
    outcomes: Counter[str] = Counter()
    unexpected: list[str] = []
    attacker = Attacker(a)
    interval = sys.getswitchinterval()
    sys.setswitchinterval(SWITCH_S)  # the two threads interleave finely
    try:
        for i in range(iterations):
            attacker.during(
                lambda i=i: outcomes.update([outcome(lambda: call(i), unexpected)])  # type: ignore[misc]
            )
    finally:
        sys.setswitchinterval(interval)
        attacker.stop()
    # The race happened: the attacker flipped root/d while calls ran (it flips only
    # between a call's start and its end), else nothing above was tested.
    assert a.flips > 0, f"the attacker never flipped during a call ({outcomes})"
    assert a.d.is_dir() and not a.d.is_symlink() and a.alt.is_symlink()
    after = state(a.outside)
    changed = sorted(k for k in {*a.before, *after} if a.before.get(k) != after.get(k))
    assert not changed, f"changed outside the root: {changed} ({outcomes}, {a.flips} flips)"
    assert not unexpected, f"unclear errors: {unexpected[:3]} ({outcomes})"
    return outcomes


def no_secret(data: bytes | Iterable[str]) -> None:
    if isinstance(data, bytes):
        assert SECRET[:6] not in data, "read a file outside the root"
    else:
        assert not [n for n in data if PLANTED in n], "listed a directory outside the root"


# -- the storage node's own calls, without Ray ----------------------------------------
