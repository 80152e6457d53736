"""The API reference as a newcomer reads it: the names a Ray Train user calls first
come first (``storage_filesystem``, not ``TransferFuture.set_result``), every public
name and the types they return are on the page, and each public function and method
says what it takes, returns and raises in Google style (``Args:``, ``Returns:``,
``Raises:``), the style the site renders (``mkdocs.yml``)."""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import air_transfer
from tests.support.procs import REPO_ROOT

PAGE = (Path(REPO_ROOT) / "docs" / "reference" / "air_transfer.md").read_text()
DIRECTIVES = re.findall(r"^::: ([\w.]+)", PAGE, re.M)
#: Public functions whose docstrings are not held to the sections (none now).
MOVING: set[str] = set()


def test_the_page_starts_with_what_a_ray_train_user_calls_first() -> None:
    assert DIRECTIVES[:2] == ["air_transfer.storage_filesystem", "air_transfer.storage_state"]
    names = [d.rsplit(".", 1)[1] for d in DIRECTIVES]
    assert names.index("ChunkedCheckpoint") < names.index("TransferFuture")
    assert "set_result" not in PAGE and "set_exception" not in PAGE


def test_every_public_name_and_the_types_it_returns_are_on_the_page() -> None:
    assert {f"air_transfer.{name}" for name in air_transfer.__all__} <= set(DIRECTIVES)
    assert "air_transfer.storage.replica_wire.CopyState" in DIRECTIVES  # replica_status's


def test_the_dcp_page_leads_with_the_train_recipe() -> None:
    page = (Path(REPO_ROOT) / "docs" / "reference" / "dcp.md").read_text()
    listed = re.findall(r"^::: air_transfer\.dcp\.(\w+)", page, re.M)
    assert listed[:2] == ["report", "load"]
    assert set(listed) == set(importlib.import_module("air_transfer.dcp").__all__)


def public_callables() -> Iterator[tuple[str, Callable[..., Any]]]:
    """Every public function, and every public method a public class defines itself,
    of ``air_transfer`` and ``air_transfer.dcp`` (but those of ``MOVING``)."""
    for module_name in ("air_transfer", "air_transfer.dcp"):
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if name in MOVING:
                continue
            if inspect.isfunction(obj):
                yield f"{module_name}.{name}", obj
            elif inspect.isclass(obj) and not issubclass(obj, BaseException):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or not callable(member):
                        continue
                    function = getattr(member, "__func__", member)
                    if inspect.isfunction(function):
                        yield f"{module_name}.{name}.{attr}", function


CALLABLES = dict(public_callables())


@pytest.mark.parametrize("name", sorted(CALLABLES))
def test_each_public_function_says_what_it_takes_and_returns(name: str) -> None:
    function = CALLABLES[name]
    doc = inspect.getdoc(function) or ""
    parameters = [
        p for p in inspect.signature(function).parameters.values()
        if p.name not in ("self", "cls") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]  # fmt: skip
    if parameters:
        assert "\nArgs:\n" in doc, f"{name}: no Args section"
        for p in parameters:
            assert re.search(rf"^    {p.name}\b", doc, re.M), f"{name}: {p.name} not in Args"
    returns = inspect.signature(function).return_annotation
    if returns not in ("None", None, inspect.Signature.empty):
        assert "\nReturns:\n" in doc, f"{name}: no Returns section"
