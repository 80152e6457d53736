"""A stand-in for ``sys.stderr`` that is, or is not, a terminal: whether progress bars
are drawn by default depends on it."""

from __future__ import annotations

import io


class FakeStderr(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty
