"""What a lower layer needs from a layer above it, handed down rather than imported.

Why: a lower layer that imported it by its dotted name (``importlib.import_module``)
would be an arrow up that import-linter cannot see. Instead the lower layer declares a
``Provided`` slot and the package root (``air_transfer/__init__``), which every
process running the library imports before any of its modules (the caller, each
node's agent, each task's worker), provides a loader: a plain import, run at first
use, so that nothing above is imported before it is needed (Ray Train, for the
checkpoint class, costs ~1 s of CPU per process).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Provided(Generic[T]):
    """A value ``what`` names, loaded at first ``get`` by the loader ``provide`` set."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._load: Callable[[], T] | None = None
        self._value: tuple[T] | None = None  # (the value,) once loaded

    def provide(self, load: Callable[[], T]) -> None:
        """Set the loader; ValueError if another one was set already (a clash)."""
        if self._load is not None and self._load is not load:
            raise ValueError(f"{self.what} is provided already (by {self._load!r})")
        self._load = load

    def get(self) -> T:
        """The value, loaded on the first call (threads racing there load the same
        value: an import); RuntimeError if none was provided."""
        if self._value is None:
            if self._load is None:
                raise RuntimeError(
                    f"{self.what} was never provided: air_transfer/__init__ provides it; "
                    "was the package imported without its __init__?"
                )
            self._value = (self._load(),)
        return self._value[0]
