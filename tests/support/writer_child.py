"""A writer in a process of its own, for test_writer_crash.py: killed mid-publish,
racing other writers, or holding a staging lock as a writer in another container.
Run from the repository root:

    python -m tests.support.writer_child merge TARGET N [--pause POINT] [--no-exchange]
    python -m tests.support.writer_child race TARGET TAG ROUNDS   (waits for a line on stdin)
    python -m tests.support.writer_child hold LOCKFILE            (until stdin closes)

With ``--pause``, the writer prints ``ready`` at POINT of its publish and stops
there until it is killed. The trees are the functions below, so that the test knows
exactly what the old and the new merged tree hold.
"""

from __future__ import annotations

import argparse
import errno
import fcntl
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

if __name__ == "__main__":
    # The writer is Ray-free core: load its modules without the package's __init__,
    # which imports Ray (seconds per process, and the test starts several).
    _spec = importlib.util.find_spec("air_transfer")  # finds it, runs nothing
    assert _spec is not None and _spec.submodule_search_locations is not None
    _package = types.ModuleType("air_transfer")
    _package.__path__ = list(_spec.submodule_search_locations)
    sys.modules["air_transfer"] = _package

from air_transfer.core import staging
from air_transfer.core.writer import write_tree
from tests.support.trees import build_manifest

PAUSES = ("before-swap", "after-swap", "between-renames")


def old_files(n: int) -> dict[str, bytes]:
    """The tree in the target before the merge: n small files in 20 directories."""
    return {f"d{i % 20:02d}/f{i:05d}": b"old %d" % i for i in range(n)}


def new_files(n: int) -> dict[str, bytes]:
    """The checkpoint merged in: a new version of 90% of the old files, and new ones."""
    replaced = {f"d{i % 20:02d}/f{i:05d}": b"new %d" % i for i in range(n * 9 // 10)}
    return replaced | {f"added/a{i:05d}": b"added %d" % i for i in range(n // 10)}


def merged_files(n: int) -> dict[str, bytes]:
    return old_files(n) | new_files(n)


def race_files(tag: str, round_: int) -> dict[str, bytes]:
    return {f"{tag}/{i}": b"%s %d %d" % (tag.encode(), round_, i) for i in range(50)} | {
        "common": f"{tag} {round_}".encode()
    }


def _stop_here() -> None:
    print("ready", flush=True)
    threading.Event().wait()  # until killed


def _pause(point: str, target: str) -> None:
    swap = staging.Staging.swap
    if point == "before-swap":

        def paused(self: staging.Staging) -> None:
            _stop_here()

    elif point == "after-swap":

        def paused(self: staging.Staging) -> None:
            swap(self)
            _stop_here()

    else:  # between-renames: after target -> air-old, before staging -> target
        rename: Callable[..., Any] = os.rename

        def renaming(src: str, dst: str) -> None:
            rename(src, dst)
            if src == target:
                _stop_here()

        def paused(self: staging.Staging) -> None:
            os.rename = renaming  # type: ignore[assignment]
            swap(self)

    staging.Staging.swap = paused  # type: ignore[method-assign]


def _refuse_exchange(a: str, b: str) -> None:
    raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS), a)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge")
    merge.add_argument("target")
    merge.add_argument("n", type=int)
    merge.add_argument("--pause", choices=PAUSES)
    merge.add_argument("--no-exchange", action="store_true")
    race = sub.add_parser("race")
    race.add_argument("target")
    race.add_argument("tag")
    race.add_argument("rounds", type=int)
    hold = sub.add_parser("hold")
    hold.add_argument("lockfile")
    args = parser.parse_args()

    if args.command == "hold":
        fd = os.open(args.lockfile, os.O_RDWR)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        print("ready", flush=True)
        sys.stdin.read()
        return
    if args.command == "race":
        manifests = [build_manifest(race_files(args.tag, r)) for r in range(args.rounds)]
        print("ready", flush=True)
        sys.stdin.readline()
        for manifest, chunks in manifests:
            write_tree(manifest, chunks, args.target)
        return
    if args.no_exchange:
        staging.exchange = _refuse_exchange
    if args.pause:
        _pause(args.pause, os.path.abspath(args.target))
    manifest, chunks = build_manifest(new_files(args.n), chunk_bytes=1 << 20)
    print("writing", flush=True)
    write_tree(manifest, chunks, args.target)


if __name__ == "__main__":
    main()
