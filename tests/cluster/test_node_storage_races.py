"""The node storage filesystem under concurrent callers, side by side with pyarrow's
``LocalFileSystem``: several threads (then several processes on several nodes) call
one operation on one path at once, as Ray Train's workers do when they report a
checkpoint together, and the outcomes must be the same.

Each race runs ``ROUNDS`` times on each filesystem, its calls released together by
a barrier, and says which outcomes a caller may see ("ok" or an exception's type).
Where ``LocalFileSystem`` itself trips over a concurrent change (its
``delete_dir_contents`` fails with FileNotFoundError on an entry another caller
removed), node storage must give the outcome of some serial order, and the race
lists the extra outcomes allowed to ``LocalFileSystem`` only. After every round the
tree on disk (hidden files included) must be the same on both.
"""

from __future__ import annotations

import hashlib
import os
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
import ray

from air_transfer import TransferConfig, storage_filesystem
from tests.support.checkpoints import MiB, on
from tests.support.cluster import node_ids
from tests.support.gates import Gate

pytestmark = pytest.mark.usefixtures("cluster")
CONFIG = TransferConfig(chunk_bytes=MiB, window=3)
BODY = os.urandom(2 * MiB + 7)
BLOCK = b"appended" * 1000
THREADS, ROUNDS = 8, 8

#: label -> outcome -> how many callers got it; label -> what the calls returned.
Outcomes = dict[str, Counter[str]]
Values = dict[str, list[Any]]
Call = tuple[str, Callable[[], Any]]


def setup(base: Path) -> None:
    """``x/`` (a tree of 30 entries), ``file`` (3 bytes), ``big`` (``BODY``), ``dir/``."""
    for i in range(3):
        (base / "x" / f"s{i}" / "t").mkdir(parents=True)
        for j in range(4):
            (base / "x" / f"s{i}" / f"f{j}").write_bytes(b"x")
            (base / "x" / f"s{i}" / "t" / f"g{j}").write_bytes(b"y")
    (base / "file").write_bytes(b"abc")
    (base / "big").write_bytes(BODY)
    (base / "dir").mkdir()


def snapshot(base: Path) -> list[tuple[str, str]]:
    """Every entry under ``base``, hidden ones included, with a digest of each file."""
    out = []
    for p in sorted(base.rglob("*")):
        kind = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        out.append((str(p.relative_to(base)), kind))
    return out


def write(f: pafs.FileSystem, path: str, body: bytes) -> None:
    with f.open_output_stream(path) as s:
        s.write(body)


def append(f: pafs.FileSystem, path: str, body: bytes) -> None:
    with f.open_append_stream(path) as s:
        s.write(body)


def listing(f: pafs.FileSystem, path: str) -> list[pafs.FileInfo]:
    return f.get_file_info(pafs.FileSelector(path, recursive=True))


def run_race(calls: list[Call]) -> tuple[Outcomes, Values]:
    """Run ``calls`` in threads released together."""
    start = threading.Barrier(len(calls))
    outcomes: Outcomes = {label: Counter() for label, _ in calls}
    values: Values = {label: [] for label, _ in calls}

    def run(label: str, call: Callable[[], Any]) -> None:
        start.wait()
        try:
            values[label].append(call())
            outcomes[label]["ok"] += 1
        except Exception as e:
            outcomes[label][type(e).__name__] += 1

    threads = [threading.Thread(target=run, args=c) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes, values


# -- what a race may end with -----------------------------------------------------------
Check = Callable[[Outcomes, Values, Path], bool]


def all_ok(label: str) -> Check:
    return lambda o, v, b: set(o[label]) == {"ok"}


def one_ok(label: str) -> Check:
    """Exactly one caller succeeds; the others find nothing there any more."""
    return lambda o, v, b: o[label]["ok"] == 1 and set(o[label]) <= {"ok", "FileNotFoundError"}


def only(label: str, *outcomes: str) -> Check:
    return lambda o, v, b: set(o[label]) <= set(outcomes)


def every(*checks: Check) -> Check:
    return lambda o, v, b: all(c(o, v, b) for c in checks)


def listings_show_what_exists(o: Outcomes, v: Values, b: Path) -> bool:
    """No NotFound entry (a vanished one) and no hidden staging or trash."""
    infos = [i for found in v["list"] for i in found]
    return all(i.type != pafs.FileType.NotFound and ".air-" not in i.path for i in infos)


def appends_all_landed(o: Outcomes, v: Values, b: Path) -> bool:
    """Every append that succeeded is in the file; one that would have dropped
    another's bytes failed instead (node storage, OSError ESTALE)."""
    body = (b / "file").read_bytes()
    return set(o["append"]) <= {"ok", "OSError"} and body == b"abc" + BLOCK * o["append"]["ok"]


@dataclass(frozen=True)
class Race:
    name: str
    calls: Callable[[pafs.FileSystem, str], list[Call]]
    check: Check
    local_also: Check | None = None  # LocalFileSystem's own races: allowed to it only
    same_tree: bool = True  # the tree after a round is the same on both

    def __str__(self) -> str:
        return self.name


def n(k: int, label: str, call: Callable[[], Any]) -> list[Call]:
    return [(label, call)] * k


RACES = [
    Race(
        "create_dir of one new path, recursive and not",
        lambda f, b: (
            n(4, "deep", lambda: f.create_dir(f"{b}/new/a/b"))
            + n(4, "flat", lambda: f.create_dir(f"{b}/new", recursive=False))
        ),
        every(all_ok("deep"), all_ok("flat")),
    ),
    Race(
        "create_dir of every depth of one path",
        lambda f, b: (
            [(f"d{k}", lambda k=k: f.create_dir(f"{b}/n" + "/a" * k)) for k in range(4)] * 2
        ),
        every(*(all_ok(f"d{k}") for k in range(4))),
    ),
    Race(
        "create_dir where a file is",
        lambda f, b: n(THREADS, "c", lambda: f.create_dir(f"{b}/file")),
        only("c", "FileExistsError"),
    ),
    Race(
        "delete_dir of one tree",
        lambda f, b: n(THREADS, "d", lambda: f.delete_dir(f"{b}/x")),
        one_ok("d"),
    ),
    Race(
        "delete_dir_contents of one tree",
        lambda f, b: n(THREADS, "d", lambda: f.delete_dir_contents(f"{b}/x")),
        all_ok("d"),
        local_also=only("d", "ok", "FileNotFoundError"),
    ),
    Race(
        "delete_file of one file",
        lambda f, b: n(THREADS, "d", lambda: f.delete_file(f"{b}/file")),
        one_ok("d"),
    ),
    Race(
        "move of one file to one place",
        lambda f, b: n(THREADS, "m", lambda: f.move(f"{b}/file", f"{b}/dir/moved")),
        one_ok("m"),
    ),
    Race(
        "copy_file of one file to one place",
        lambda f, b: n(THREADS, "c", lambda: f.copy_file(f"{b}/big", f"{b}/dir/copy")),
        all_ok("c"),
    ),
    Race(
        "write of one file",
        lambda f, b: n(THREADS, "w", lambda: write(f, f"{b}/dir/out", BODY)),
        all_ok("w"),
    ),
    Race(
        "append to one file",
        lambda f, b: n(THREADS, "append", lambda: append(f, f"{b}/file", BLOCK)),
        appends_all_landed,
        same_tree=False,  # as many appends as succeeded
    ),
    Race(
        "recursive listing while the tree is deleted",
        lambda f, b: (
            n(6, "list", lambda: listing(f, f"{b}/x")) + n(2, "d", lambda: f.delete_dir(f"{b}/x"))
        ),
        every(only("list", "ok", "FileNotFoundError"), one_ok("d"), listings_show_what_exists),
    ),
    Race(
        "listing while files are written into it",
        lambda f, b: (
            n(4, "list", lambda: listing(f, f"{b}/dir"))
            + [("w", lambda i=i: write(f, f"{b}/dir/w{i}", BODY)) for i in range(4)]
        ),
        every(all_ok("list"), all_ok("w"), listings_show_what_exists),
    ),
    Race(
        "create_dir inside a tree while it is deleted",
        lambda f, b: (
            n(4, "c", lambda: f.create_dir(f"{b}/x/s0/new"))
            + n(4, "d", lambda: f.delete_dir(f"{b}/x"))
        ),
        every(all_ok("c"), only("d", "ok", "FileNotFoundError")),
        local_also=every(
            only("c", "ok", "FileExistsError"), only("d", "ok", "FileNotFoundError", "OSError")
        ),
        same_tree=False,  # whether x/s0/new survives depends on the order
    ),
]


@pytest.mark.parametrize("race", RACES, ids=str)
def test_concurrent_callers_get_what_local_filesystem_gives(tmp_path: Path, race: Race) -> None:
    """Defect (``create_dir``): the agent checked isdir, then called makedirs without
    exist_ok, so of callers creating one directory at once all but one raised
    FileExistsError (Ray Train's workers reporting together). Every race here is
    run against both filesystems; node storage's calls cross nodes."""
    filesystems = {
        "local": pafs.LocalFileSystem(),
        "node storage": storage_filesystem(node_ids()["node_a"], CONFIG, root=str(tmp_path)),
    }
    trees: dict[str, list[list[tuple[str, str]]]] = {}
    for name, f in filesystems.items():
        trees[name] = []
        for r in range(ROUNDS):
            base = tmp_path / f"{name}-{r}".replace(" ", "-")
            setup(base)
            outcomes, values = run_race(race.calls(f, str(base)))
            fine = race.check(outcomes, values, base)
            if not fine and name == "local" and race.local_also is not None:
                fine = race.local_also(outcomes, values, base)
            assert fine, f"{name}, round {r}: {dict(outcomes)}"
            trees[name].append(snapshot(base))
    if race.same_tree:
        assert trees["node storage"] == trees["local"]
    for tree in trees["node storage"]:
        assert not [p for p, _ in tree if ".air-" in p], "hidden staging or trash left"


# -- processes on several nodes -----------------------------------------------------------
def process_calls(race: str, f: pafs.FileSystem, base: str) -> list[Call]:
    return {
        "create_dir": n(4, "c", lambda: f.create_dir(f"{base}/new/a/b")),
        "delete_dir": n(4, "d", lambda: f.delete_dir(f"{base}/x")),
        "write": n(4, "w", lambda: write(f, f"{base}/dir/out", BODY)),
    }[race]


@ray.remote(num_cpus=0)
def race_here(race: str, f: pafs.FileSystem, base: str, gate: Any) -> dict[str, Counter[str]]:
    """This process's threads of a race, once every process has arrived at ``gate``."""
    calls = process_calls(race, f, base)
    ray.get(gate.arrive_and_wait.remote())
    return run_race(calls)[0]


@pytest.mark.parametrize(
    ("race", "check"),
    [("create_dir", all_ok("c")), ("delete_dir", one_ok("d")), ("write", all_ok("w"))],
    ids=["create_dir", "delete_dir", "write"],
)
def test_concurrent_processes_on_several_nodes(tmp_path: Path, race: str, check: Check) -> None:
    """Processes on three nodes (four threads each) call one operation of one
    storage at once, as the workers of a Ray Train run do."""
    f = storage_filesystem(node_ids()["node_a"], CONFIG, root=str(tmp_path))
    nodes = ("head", "node_a", "node_b")
    for r in range(3):
        base = tmp_path / f"round-{r}"
        setup(base)
        gate = Gate.remote()
        tasks = [race_here.options(**on(node)).remote(race, f, str(base), gate) for node in nodes]
        ray.get(gate.wait_for_arrivals.remote(len(nodes)))
        gate.open.remote()
        total: Outcomes = {}
        for outcomes in ray.get(tasks):
            for label, counts in outcomes.items():
                total[label] = total.get(label, Counter()) + counts
        assert check(total, {}, base), f"round {r}: {total}"
        assert not [p for p, _ in snapshot(base) if ".air-" in p]
