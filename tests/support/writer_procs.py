"""Writers in child processes, and the trees they leave, for the crash and
concurrency tests of the writer."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

from tests.support.procs import REPO_ROOT, child_env

TIMEOUT = 120.0


class Child:
    """A ``tests.support.writer_child`` process and the lines it prints."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.support.writer_child", *args],
            cwd=REPO_ROOT,
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("")  # it exited

    def wait_for(self, expected: str) -> None:
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.001))
            except queue.Empty:
                self.kill()
                raise AssertionError(f"the child printed no {expected!r} in {TIMEOUT}s") from None
            if line == expected:
                return
            if line == "":
                assert self.proc.stderr is not None
                raise AssertionError(
                    f"the child exited ({self.proc.wait()}) before {expected!r}:\n"
                    f"{self.proc.stderr.read()}"
                )

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def finish(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        assert self.proc.wait(timeout=TIMEOUT) == 0, self.proc.stderr and self.proc.stderr.read()


def put_files(root: Path, files: dict[str, bytes]) -> None:
    for directory in {os.path.dirname(p) for p in files}:
        os.makedirs(root / directory, exist_ok=True)
    for path, data in files.items():
        fd = os.open(f"{root}/{path}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, data)
        os.close(fd)


def tree_of(files: dict[str, bytes]) -> dict[str, bytes | str]:
    """What ``file_contents`` reads back from a tree holding ``files``."""
    tree: dict[str, bytes | str] = {}
    for path, data in files.items():
        parts = path.split("/")
        for i in range(1, len(parts)):
            tree["/".join(parts[:i])] = ""
        tree[path] = data
    return tree


def assert_one_tree(got: dict[str, bytes | str], old: dict, new: dict) -> str:
    """``got`` is exactly ``old`` or exactly ``new``; returns which."""
    if got == old:
        return "old"
    if got == new:
        return "new"
    from_old = sum(1 for p, v in got.items() if old.get(p) == v and new.get(p) != v)
    from_new = sum(1 for p, v in got.items() if new.get(p) == v and old.get(p) != v)
    raise AssertionError(
        f"the target is neither tree: {from_old} entries only the old one has, "
        f"{from_new} only the new one, {len(got)} in all (old {len(old)}, new {len(new)})"
    )
