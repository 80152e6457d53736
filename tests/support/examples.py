"""The scripts in ``examples/`` imported as a user runs them, for the tests that run
each one's ``main()`` at small size."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from tests.support.procs import REPO_ROOT

EXAMPLES = Path(REPO_ROOT) / "examples"


def load(name: str) -> ModuleType:
    """``examples/<name>.py`` imported by path (``examples/`` is not a package). It is
    not put in ``sys.modules``: Ray then pickles its functions and classes by value,
    as it does those of a script run as ``__main__``, so workers need not import it."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
