"""Refusing positional arguments with a message that says what to write instead.

A public function whose arguments became keyword-only (or changed order) would
otherwise fail with Python's bare "takes 1 positional argument but 2 were given",
or, worse, take a path for a node id. The wrapper keeps the function's signature for
``inspect``, documentation tools and mypy (``ParamSpec``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")


def positional_at_most(count: int, message: str) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Decorate a function so that a call with more than ``count`` positional
    arguments raises ``TypeError(message)`` before the function runs."""

    def decorate(fn: Callable[P, R]) -> Callable[P, R]:
        @functools.wraps(fn)
        def checked(*args: P.args, **kwargs: P.kwargs) -> R:
            if len(args) > count:
                raise TypeError(message)
            return fn(*args, **kwargs)

        return checked

    return decorate
