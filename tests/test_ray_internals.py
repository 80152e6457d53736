"""Ray's private API lives in one module, ``air_transfer._ray``: every private name it
uses still exists in the installed Ray, and no other module reaches for one."""

from __future__ import annotations

import functools
import importlib
import re
from pathlib import Path

import pytest

from air_transfer import _ray

PACKAGE = Path(_ray.__file__).parent
#: What a use of Ray's private API looks like in source.
PRIVATE_USE = re.compile(
    r"ray\._private|ray\.tune\.utils\.file_transfer|_generator_backpressure|"
    r"_get_temporary_checkpoint_dir|\._uuid\b|\._actor_id\b|\._PackActor\b|"
    r"_force_on_node|_unpack_from_actor"
)


@pytest.mark.parametrize(
    ("module", "name"), _ray.PRIVATE_NAMES, ids=[f"{m}:{n}" for m, n in _ray.PRIVATE_NAMES]
)
def test_each_private_name_exists_in_the_installed_ray(module: str, name: str) -> None:
    owner = importlib.import_module(module)
    assert functools.reduce(getattr, name.split("."), owner) is not None


def test_the_backpressure_option_is_one_ray_accepts() -> None:
    from ray._common.ray_option_utils import task_options

    assert _ray.BACKPRESSURE_OPTION in task_options


def test_no_other_module_uses_rays_private_api() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE)}:{n}: {line.strip()}"
        for path in PACKAGE.rglob("*.py")
        if path.name != "_ray.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if PRIVATE_USE.search(line) and not line.lstrip().startswith("#")
    ]
    assert offenders == []
