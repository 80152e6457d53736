"""When a transfer shows a progress bar: an explicit ``TransferConfig.progress``, then
the ``AIR_TRANSFER_PROGRESS`` environment variable, then whether stderr is a terminal
(no Ray)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from air_transfer import TransferConfig
from air_transfer.observe import progress
from tests.support.terminal import FakeStderr


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test decides the variable itself."""
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    yield


# -- when: config > AIR_TRANSFER_PROGRESS > terminal ------------------------------------


@pytest.mark.parametrize("tty", [True, False], ids=["tty", "no-tty"])
@pytest.mark.parametrize("env", [None, "1", "0"], ids=["no-env", "env-on", "env-off"])
@pytest.mark.parametrize("setting", [None, True, False], ids=["auto", "on", "off"])
def test_progress_precedence(
    monkeypatch: pytest.MonkeyPatch, tty: bool, env: str | None, setting: bool | None
) -> None:
    """An explicit ``TransferConfig.progress`` wins, then the environment variable,
    then whether stderr is a terminal."""
    monkeypatch.setattr("sys.stderr", FakeStderr(tty))
    if env is None:
        monkeypatch.delenv(progress.ENV_VAR, raising=False)
    else:
        monkeypatch.setenv(progress.ENV_VAR, env)
    expected = setting if setting is not None else (env == "1" if env is not None else tty)
    assert progress.progress_enabled(TransferConfig(progress=setting).progress) is expected


def test_auto_on_a_real_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """Automatic means a real pseudo-terminal on stderr turns bars on, a file not."""
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    leader, follower = os.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            monkeypatch.setattr("sys.stderr", tty)
            assert progress.progress_enabled(None)
    finally:
        os.close(leader)
        os.close(follower)
    with open(os.devnull, "w") as null:
        monkeypatch.setattr("sys.stderr", null)
        assert not progress.progress_enabled(None)


@pytest.mark.parametrize("value", ["TRUE", " on ", "yes"])
def test_env_words_for_on(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setattr("sys.stderr", FakeStderr(False))
    monkeypatch.setenv(progress.ENV_VAR, value)
    assert progress.progress_enabled(None)


def test_env_value_not_understood_is_ignored_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("sys.stderr", FakeStderr(True))
    monkeypatch.setenv(progress.ENV_VAR, "sometimes")
    assert progress.progress_enabled(None)  # the terminal decides
    assert "ignoring AIR_TRANSFER_PROGRESS='sometimes'" in caplog.text


def test_config_progress_validated_and_not_part_of_the_cut() -> None:
    with pytest.raises(TypeError, match=r"TransferConfig.progress must be True, False or None"):
        TransferConfig(progress="yes")  # type: ignore[arg-type]
    # It changes nothing about how a checkpoint is cut or carried: no repacking.
    assert TransferConfig(progress=True) == TransferConfig()
    assert TransferConfig().replace(progress=False).progress is False
