"""No module of the package imports one of its own modules by dotted name
(``importlib.import_module``, ``__import__``) but the package root, whose lazy public
names are the one documented place: such an import in a lower layer is an arrow up
that import-linter cannot draw. A lower layer gets what it needs from above handed
down instead (``core.provided``). Read from source with ``ast``, no Ray."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.support.procs import REPO_ROOT

#: The package's source.
PACKAGE = Path(REPO_ROOT) / "air_transfer"
#: The one module allowed to import the package's modules by name (its lazy names).
ALLOWED = {PACKAGE / "__init__.py"}


def dotted_imports(source: str) -> list[tuple[int, str]]:
    """(line, what) of each call in ``source`` that may import a module of the package
    by name: ``import_module`` (however imported or aliased) or ``__import__`` with a
    name that is the package's, relative, or not a literal (it could be either)."""
    tree = ast.parse(source)
    importers = {"import_module", "__import__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "importlib":
            importers |= {a.asname for a in node.names if a.name == "import_module" and a.asname}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        if name not in importers:
            continue
        target = node.args[0] if node.args else None
        literal = target.value if isinstance(target, ast.Constant) else None
        if isinstance(literal, str) and not (
            literal == "air_transfer" or literal.startswith(("air_transfer.", "."))
        ):
            continue  # a module outside the package
        found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_imports_the_package_by_dotted_name_but_the_root() -> None:
    offenders = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in ALLOWED and (hits := dotted_imports(path.read_text()))
    }
    assert offenders == {}, f"hand each down (core.provided), not imported by name: {offenders}"


def test_the_root_is_the_one_place_and_still_scanned() -> None:
    """The allowance is not vacuous: the root's lazy names are what the scan sees."""
    (root,) = ALLOWED
    assert dotted_imports(root.read_text())


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\nimportlib.import_module('air_transfer.agent')",
        "from importlib import import_module\nimport_module('air_transfer.checkpoint')",
        "from importlib import import_module as load\nload('air_transfer.agent')",
        "import importlib as il\nil.import_module(f'{PACKAGE}.agent')",
        "__import__('air_transfer.storage.server.replica_host')",
        "import importlib\nimportlib.import_module('.agent', 'air_transfer')",
    ],
)
def test_each_form_is_seen(source: str) -> None:
    assert len(dotted_imports(source)) == 1


@pytest.mark.parametrize(
    "source",
    [
        "import importlib\nimportlib.import_module('fsspec')",
        "from air_transfer.agent import NodeAgent",
        "def f():\n    from air_transfer.checkpoint import ChunkedCheckpoint",
    ],
)
def test_plain_imports_and_other_packages_pass(source: str) -> None:
    assert dotted_imports(source) == []
