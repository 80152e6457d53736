"""``dcp.crc.without_crc32``, no Ray: ``torch.save`` skips its records' crc32 in the
marked context only; another thread's save meanwhile keeps it, torch's own setting
still rules everywhere else, what is saved without it loads back the same, and on a
torch whose setting is process-wide nothing changes."""

from __future__ import annotations

import io
import threading
import zipfile
from collections.abc import Iterator

import pytest
import torch
import torch.serialization

from air_transfer.dcp.crc import without_crc32


def saved(tensor: torch.Tensor) -> bytes:
    out = io.BytesIO()
    torch.save(tensor, out)
    return out.getvalue()


def crcs(archive: bytes) -> list[int]:
    """The crc32 field of every record of a ``torch.save`` archive."""
    return [info.CRC for info in zipfile.ZipFile(io.BytesIO(archive)).infolist()]


@pytest.fixture
def torch_setting() -> Iterator[None]:
    """torch's process-wide setting, as it was, afterwards."""
    before = torch.serialization.get_crc32_options()
    yield
    torch.serialization.set_crc32_options(before)


def test_only_saves_within_the_context_skip_the_crc32_and_they_load_the_same() -> None:
    tensor = torch.arange(1000, dtype=torch.float32)
    assert all(crcs(saved(tensor)))
    with without_crc32():
        archive = saved(tensor)
    assert set(crcs(archive)) == {0}
    assert all(crcs(saved(tensor)))  # the context has ended
    assert torch.equal(torch.load(io.BytesIO(archive), weights_only=True), tensor)


def test_another_threads_save_meanwhile_keeps_its_crc32() -> None:
    inside, done = threading.Event(), threading.Event()
    tensor = torch.ones(100)
    archives: list[bytes] = []

    def writer() -> None:  # a DCP writer's thread: in the context, until told
        with without_crc32():
            inside.set()
            assert done.wait(timeout=30)
            archives.append(saved(tensor))

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert inside.wait(timeout=30)
        assert all(crcs(saved(tensor)))  # this thread, while the other is inside
    finally:
        done.set()
        thread.join(timeout=30)
    assert [set(crcs(a)) for a in archives] == [{0}]


def test_torchs_own_setting_rules_outside_the_context(torch_setting: None) -> None:
    tensor = torch.ones(10)
    torch.serialization.set_crc32_options(False)
    with without_crc32():
        pass
    assert set(crcs(saved(tensor))) == {0}  # torch's setting, not the context's
    torch.serialization.set_crc32_options(True)
    assert all(crcs(saved(tensor)))
    with without_crc32():
        assert set(crcs(saved(tensor))) == {0}


def test_contexts_nest() -> None:
    tensor = torch.ones(10)
    with without_crc32():
        with without_crc32():
            pass
        assert set(crcs(saved(tensor))) == {0}  # the outer context still holds
    assert all(crcs(saved(tensor)))


def test_before_torch_2_13_the_crc32_stays(monkeypatch: pytest.MonkeyPatch) -> None:
    """There torch's setting was process-wide: changing it would change every thread's."""
    monkeypatch.setattr(torch, "__version__", "2.12.1+cpu")
    with without_crc32():
        assert all(crcs(saved(torch.ones(10))))
