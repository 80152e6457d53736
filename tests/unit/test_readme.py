"""The README as CI runs it (``.ci/readme_commands.py``): its install block clones
this project and installs the clone, after which every Python block of the README,
the quick starts, runs unchanged in that fresh environment (a README that no
longer works fails CI, not a newcomer); and an extra that brings torch is installed
over a CPU torch, which must still be there after it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tests.support.procs import REPO_ROOT

sys.path.insert(0, str(Path(REPO_ROOT) / ".ci"))
import readme_commands  # CI's script, beside the tests' root

README = (Path(REPO_ROOT) / "README.md").read_text()
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


def test_the_readme_has_its_quick_starts() -> None:
    assert len(BLOCKS) >= 2 and any("TorchTrainer" in b for b in BLOCKS)


def test_the_install_block_installs_a_clone_and_the_quick_starts_follow() -> None:
    """The first shell block: a clone of this project, then the install of the clone
    with torch (after CI's CPU torch); ``run_others`` runs the quick starts after a
    block that clones (``is_where_ci_is``)."""
    first = readme_commands.blocks()[0]
    steps = [step for line in first for step in line]
    assert any(readme_commands.is_where_ci_is(s) for s in steps), steps
    installs = [s for line in first for s in readme_commands.split(line)[0]]
    assert installs[0] == f"pip install -q {readme_commands.TORCH_CPU}"
    assert "pip install '.[torch]'" in installs


def test_an_extra_with_a_torch_range_gets_the_cpu_build_first_and_test_pins_it() -> None:
    """``[torch]`` keeps a user's own torch (a range): CI installs the CPU build first,
    as a PyTorch user has one. ``[test]`` pins that build itself: its line alone
    installs it, so nothing CI adds hides a missing step."""
    assert readme_commands.TORCH_EXTRAS == ["test", "torch"]
    assert readme_commands.TORCH_RANGE_EXTRAS == ["torch"]
    assert readme_commands.TORCH_CPU in readme_commands.PROJECT["optional-dependencies"]["test"]
    step = "pip install 'air-transfer[bench,torch]'"
    assert readme_commands.split([step])[0][0] == f"pip install -q {readme_commands.TORCH_CPU}"
    assert readme_commands.split(["pip install -e '.[test]'"])[0] == ["pip install -e '.[test]'"]
    assert readme_commands.split(["pip install -e '.[bench]'"])[0] == ["pip install -e '.[bench]'"]
