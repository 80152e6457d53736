"""Progress bars on long transfers: that a bar counts the transfer's bytes, that a Ray
worker's bar goes through Ray's ``tqdm_ray`` to the driver, and that with progress off
nothing is made at all. When a bar is shown at all is in ``tests/unit/test_progress_when.py``."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.experimental import tqdm_ray

from air_transfer import ChunkedCheckpoint, TransferConfig, checkpoint
from air_transfer.cluster.nodes import node_agent
from air_transfer.config import KiB
from air_transfer.core.knobs import Knobs
from air_transfer.observe import progress, telemetry
from tests.support.terminal import FakeStderr
from tests.support.waiting import eventually

# -- what a bar shows ----------------------------------------------------------------------


class _Made:
    """Records every real bar ``progress.make_bar`` makes (observing, not replacing)."""

    def __init__(self) -> None:
        self.bars: list[Any] = []
        self.real = progress.make_bar

    def __call__(self, desc: str, total: int | None, initial: int) -> Any:
        bar = self.real(desc, total, initial)
        self.bars.append(bar)
        return bar

    def named(self, prefix: str) -> list[Any]:
        return [b for b in self.bars if str(getattr(b, "desc", "")).startswith(prefix)]


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> _Made:
    recorder = _Made()
    monkeypatch.setattr(progress, "make_bar", recorder)
    return recorder


@pytest.fixture
def no_delay(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bars drawn at once, not after a second: the tests' transfers are quick."""
    monkeypatch.setattr(telemetry, "KNOBS", Knobs(progress_delay_s=0.0))


def _source(root: Path, sizes: list[int]) -> tuple[Path, int]:
    root.mkdir()
    for i, size in enumerate(sizes):
        (root / f"part-{i}.bin").write_bytes(os.urandom(size))
    (root / "empty").write_bytes(b"")
    return root, sum(sizes)


# Packing held at a known point, so that "still packing when the bar looks" is a state,
# not a race (a small checkpoint may otherwise be packed before the caller looks).


@ray.remote(num_cpus=0)
class _Gate:
    def __init__(self) -> None:
        self.arrived, self.opened = asyncio.Event(), asyncio.Event()

    async def arrive_and_wait(self) -> None:
        self.arrived.set()
        await self.opened.wait()

    async def wait_arrived(self) -> None:
        await self.arrived.wait()

    def open(self) -> None:
        self.opened.set()


@dataclass
class _HoldAt:
    """Packing hook for the node agent: the first span read at file offset ``offset``
    or later waits at ``gate``."""

    offset: int
    gate: Any
    fired: bool = False

    def __call__(self, where: str, span: Any) -> None:
        if not self.fired and span.file_offset >= self.offset:
            self.fired = True
            ray.get(self.gate.arrive_and_wait.remote())


def _set_hook(agent: Any, hook: Any) -> None:
    from air_transfer.core import proven_read

    proven_read._after_span_read = hook


@pytest.fixture
def held_packing(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """``hold(offset)``: the agent's next packing stops at ``offset`` until the
    caller's progress watch has looked at it (asked for the chunks to follow)."""
    agent = node_agent()
    looked = threading.Event()
    real = checkpoint._packing_chunks

    def packing_chunks(ref: Any) -> Any:
        looked.set()
        return real(ref)

    monkeypatch.setattr(checkpoint, "_packing_chunks", packing_chunks)
    openers: list[threading.Thread] = []

    def hold(offset: int) -> None:
        gate = _Gate.remote()
        ray.get(agent.__ray_call__.remote(_set_hook, _HoldAt(offset, gate)))

        def open_when_looked() -> None:
            try:
                ray.get(gate.wait_arrived.remote(), timeout=60)
                looked.wait(60)
            finally:
                ray.get(gate.open.remote())

        openers.append(threading.Thread(target=open_when_looked, daemon=True))
        openers[-1].start()

    yield hold
    for thread in openers:
        thread.join(60)
    ray.get(agent.__ray_call__.remote(_set_hook, None))


@pytest.mark.usefixtures("ray_local", "no_delay")
@pytest.mark.parametrize("strategy", ["inline", "chunked", "streamed"])
def test_bars_count_the_bytes_of_the_transfer(
    tmp_path: Path,
    made: _Made,
    held_packing: Any,
    capsys: pytest.CaptureFixture[str],
    strategy: str,
) -> None:
    """``to_object_ref`` draws a packing bar and ``to_directory`` a reading bar, each
    ending at the checkpoint's byte count, on stderr (stdout stays clean)."""
    src, total = _source(tmp_path / "src", [300 * KiB, 200 * KiB + 17, 0, 33])
    config = TransferConfig(chunk_bytes=64 * KiB, window=16, strategy=strategy, progress=True)
    held_packing(2 * config.chunk_bytes)
    ref = ChunkedCheckpoint.from_directory(src).to_object_ref(config)
    (pack,) = made.named("to_object_ref src")
    assert (pack.n, pack.total) == (total, total)
    restored = ChunkedCheckpoint.from_object_ref(ref)
    restored.to_directory(tmp_path / "out")
    (read,) = made.named("to_directory out")
    assert (read.n, read.total) == (total, total)
    assert read.unit == "B"
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "to_directory out" in captured.err and "100%" in captured.err


@pytest.mark.usefixtures("ray_local", "no_delay")
def test_async_packing_bar_runs_on_a_thread(tmp_path: Path, made: _Made, held_packing: Any) -> None:
    src, total = _source(tmp_path / "src", [1024 * KiB])
    config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked", progress=True)
    held_packing(4 * config.chunk_bytes)
    future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(config)
    future.result(timeout=60)
    eventually(lambda: not _progress_threads(), "the packing bar's thread to end")
    (pack,) = made.named("to_object_ref src")
    assert (pack.n, pack.total) == (total, total)


@pytest.mark.usefixtures("ray_local")
def test_quick_transfers_draw_nothing(
    tmp_path: Path, made: _Made, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bar is drawn only once a transfer has run for ``progress_delay_s``."""
    monkeypatch.setattr(telemetry, "KNOBS", Knobs(progress_delay_s=3000.0))
    src, _ = _source(tmp_path / "src", [300 * KiB])
    config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked", progress=True)
    ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config)
    ).to_directory(tmp_path / "out")
    assert made.bars == []


@pytest.mark.usefixtures("ray_local", "no_delay")
@pytest.mark.parametrize("how", ["config", "env"])
def test_progress_off_makes_nothing(
    tmp_path: Path, made: _Made, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Off (by the config, or by the variable where the config says nothing, even on
    a terminal): no bar object, no watching thread."""
    monkeypatch.setattr("sys.stderr", FakeStderr(True))
    built: list[object] = []
    real_bar = telemetry.Bar

    def bar(*args: Any) -> Any:
        built.append(args)
        return real_bar(*args)

    monkeypatch.setattr(telemetry, "Bar", bar)
    watches: list[object] = []
    monkeypatch.setattr(telemetry.PackWatch, "run", lambda self: watches.append(self))
    setting: bool | None = False
    if how == "env":
        setting = None
        monkeypatch.setenv(progress.ENV_VAR, "0")
    src, _ = _source(tmp_path / "src", [300 * KiB])
    config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked", progress=setting)
    ckpt = ChunkedCheckpoint.from_directory(src)
    ChunkedCheckpoint.from_object_ref(ckpt.to_object_ref(config)).to_directory(tmp_path / "a")
    ChunkedCheckpoint.from_object_ref(ckpt.to_object_ref_async(config).result()).to_directory(
        tmp_path / "b"
    )
    assert (built, watches, made.bars) == ([], [], [])
    assert not _progress_threads()


# -- inside Ray workers: tqdm_ray, drawn by the driver -----------------------------------


@ray.remote(num_cpus=0)
def _read_in_worker(ckpt: ChunkedCheckpoint, target: str) -> list[str]:
    """Reads ``ckpt`` in a Ray worker with bars drawn at once; the classes of the bars
    made, by module."""
    kinds: list[str] = []
    knobs, make_bar = telemetry.KNOBS, progress.make_bar

    def recording(desc: str, total: int | None, initial: int) -> Any:
        bar = make_bar(desc, total, initial)
        kinds.append(type(bar).__module__)
        return bar

    telemetry.KNOBS, progress.make_bar = Knobs(progress_delay_s=0.0), recording
    try:
        ckpt.to_directory(target)
    finally:  # the worker process is reused by later tests
        telemetry.KNOBS, progress.make_bar = knobs, make_bar
    return kinds


@pytest.mark.usefixtures("ray_local")
def test_worker_bars_go_through_tqdm_ray_to_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, total = _source(tmp_path / "src", [400 * KiB + 3])
    config = TransferConfig(chunk_bytes=64 * KiB, strategy="chunked", progress=True)
    ckpt = ChunkedCheckpoint.from_object_ref(
        ChunkedCheckpoint.from_directory(src).to_object_ref(config)
    )
    # What the driver's tqdm_ray manager receives from the workers' log stream.
    manager = tqdm_ray.instance()
    states: list[dict[str, Any]] = []
    receive = manager.process_state_update

    def received(state: dict[str, Any]) -> None:
        states.append(dict(state))
        receive(state)

    monkeypatch.setattr(manager, "process_state_update", received)
    kinds = ray.get(_read_in_worker.remote(ckpt, str(tmp_path / "out")))
    assert kinds == ["ray.experimental.tqdm_ray"]
    assert (tmp_path / "out" / "part-0.bin").stat().st_size == total

    def final() -> bool:
        return any(
            s["closed"]
            and s["x"] == total
            and s["total"] == total
            and "to_directory out" in s["desc"]
            for s in states
        )

    eventually(final, "the worker's closed bar to reach the driver")


# -- helpers -------------------------------------------------------------------------------


def _progress_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "air-transfer-progress"]


@pytest.fixture(autouse=True)
def _no_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test decides the variable itself."""
    monkeypatch.delenv(progress.ENV_VAR, raising=False)
    yield
