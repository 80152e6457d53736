"""What the package is built from (``pyproject.toml``) and what it ships: a torch
range for users (CI installs its CPU build first), Ray pinned to the minor versions
whose private names ``test_ray_internals.py`` pins, a license, no stray files.
Building and installing the wheel and sdist is ``.ci/check_dist.py``'s (it needs
the package registry)."""

from __future__ import annotations

from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.support.procs import REPO_ROOT

ROOT = Path(REPO_ROOT)
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements(extra: str | None = None) -> dict[str, Requirement]:
    listed = PROJECT["project"]
    raw = listed["dependencies"] if extra is None else listed["optional-dependencies"][extra]
    return {Requirement(r).name: Requirement(r) for r in raw}


def test_the_torch_extra_takes_a_users_torch_and_the_test_extra_pins_the_cpu_build() -> None:
    """An exact pin in ``[torch]`` replaced a user's torch (a multi-GB CUDA build);
    ``[test]`` pins the one the suite is checked with, whose CPU build the package
    registry holds: a range there would pull the newest (CUDA) torch."""
    torch = requirements("torch")["torch"].specifier
    assert "2.9" in torch and "2.13.0" in torch and "2.99" in torch
    assert "3.0" not in torch and "2.8" not in torch
    assert str(requirements("test")["torch"].specifier) == "==2.13.0"


def test_ray_is_pinned_to_the_supported_minor_versions() -> None:
    """One range, where the library checks it at import (``core.ray_range``) and
    wherever the package asks for Ray."""
    from air_transfer.core.ray_range import requirement

    for extra in (None, "test", "default"):  # the bench extra adds no Ray of its own
        ray = requirements(extra)["ray"].specifier
        assert str(ray) == str(SpecifierSet(requirement())), (extra, ray)
        assert "2.58.0" in ray and "2.60.9" in ray and "2.61.0" not in ray, (extra, ray)
        assert "2.57.1" not in ray, (extra, ray)


def test_the_license_and_project_metadata_are_shipped() -> None:
    project = PROJECT["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert set(project["urls"]) >= {"Homepage", "Source", "Issues"}
    assert "Typing :: Typed" in project["classifiers"]
    assert (ROOT / "air_transfer" / "py.typed").exists()
    assert Requirement(PROJECT["build-system"]["requires"][0]).specifier.contains("77.0")


def test_no_built_artifacts_are_committed_at_the_root() -> None:
    assert not list(ROOT.glob("*.whl")) and not list(ROOT.glob("*.tar.gz"))
