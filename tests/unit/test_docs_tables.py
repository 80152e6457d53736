"""The operations pages list everything a user can set or watch: every field of the
two configuration objects and every ``AIR_TRANSFER_*`` variable the package reads
(docs/operations/settings.md), every metric it records (docs/operations/metrics.md),
and every command and option of ``air-transfer`` (docs/operations/cli.md). A knob
added without its line in the docs fails here, not in a user's hands."""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from air_transfer.cli.main import build_parser
from air_transfer.config import StorageConfig, TransferConfig
from air_transfer.observe import durable_metrics, replica_metrics
from air_transfer.observe.metrics import Metric
from tests.support.procs import REPO_ROOT

#: Imported so that every metric of the package is declared (``Metric.declared``).
DECLARING = (durable_metrics, replica_metrics)
ROOT = Path(REPO_ROOT)
PACKAGE = ROOT / "air_transfer"
OPERATIONS = ROOT / "docs" / "operations"


def sources(folder: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.rglob("*.py")))


def table_rows(page: Path) -> set[str]:
    """The first cell of every table row of ``page``, without its backquotes."""
    rows = re.findall(r"^\| `([^`]+)`", page.read_text(), re.M)
    return {row.split(" ")[0] for row in rows}


@pytest.mark.parametrize("config", [TransferConfig, StorageConfig])
def test_every_setting_has_its_row(config: type) -> None:
    rows = table_rows(OPERATIONS / "settings.md")
    assert {f.name for f in dataclasses.fields(config)} - rows == set()


def test_every_environment_variable_has_its_row() -> None:
    read = set(re.findall(r"AIR_TRANSFER_[A-Z0-9_]+", sources(PACKAGE)))
    assert len(read) >= 4
    assert read - table_rows(OPERATIONS / "settings.md") == set()


def metric_names() -> set[str]:
    """Every metric the package records, without ``air_transfer_`` (the one source)."""
    names = {m.name for m in Metric.declared}
    assert len(names) >= 14
    return names


def pages() -> dict[str, str]:
    """The README and every page of the documentation, by path."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return {str(p.relative_to(ROOT)): p.read_text() for p in found}


def test_every_name_a_page_mentions_is_one_the_package_has() -> None:
    """A metric or a setting named on any page (in any of its spellings: Prometheus',
    Ray's, the bare name) is one the package records or reads: pages that named the
    same thing differently, or a thing that is gone, fail here."""
    metrics = metric_names()
    variables = set(re.findall(r"AIR_TRANSFER_[A-Z0-9_]+", sources(PACKAGE)))
    wrong = []
    for path, text in pages().items():
        for name in re.findall(r"\b(?:ray_)?air_transfer_([a-z0-9_]+)", text):
            if re.sub(r"_total$", "", name) not in metrics and name not in metrics:
                wrong.append(f"{path}: metric air_transfer_{name}")
        for name in re.findall(r"`(durable_[a-z_]+)`", text):  # a durable metric, bare
            if re.sub(r"_total$", "", name) not in metrics and not hasattr(StorageConfig, name):
                wrong.append(f"{path}: `{name}`")
        wrong += [f"{path}: {v}" for v in re.findall(r"AIR_TRANSFER_[A-Z0-9_]+", text)
                  if v not in variables]  # fmt: skip
    assert wrong == []


def test_every_metric_has_its_row() -> None:
    names = metric_names()
    documented = {
        re.sub(r"^ray_|_total$", "", row) for row in table_rows(OPERATIONS / "metrics.md")
    }
    assert {f"air_transfer_{name}" for name in names} - documented == set()


def test_every_command_and_option_of_the_cli_is_documented() -> None:
    page = (OPERATIONS / "cli.md").read_text()
    [commands] = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    for name, parser in commands.choices.items():
        assert f"## `{name}`" in page, name
        for action in parser._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}" in page or f"{flag}`" in page or flag in page, flag
