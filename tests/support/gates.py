"""Make a transfer stop at a known point, so a fault can be injected mid-transfer
without sleeps: the reader fetches the first chunk, announces it at a Gate, and
fetches nothing more until the test opens the gate."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import ray

from air_transfer import ChunkedCheckpoint, TransferConfig
from air_transfer.core.manifest import Manifest
from air_transfer.extend import PackRequest, TransferStrategy
from air_transfer.transfer.strategies.base import Layout, Packed
from air_transfer.transfer.strategies.chunked import ChunkedStrategy


@ray.remote(num_cpus=0)
class Gate:
    def __init__(self) -> None:
        self.arrivals = 0
        self.arrived = asyncio.Event()
        self.opened = asyncio.Event()

    async def arrive_and_wait(self) -> None:
        self.arrivals += 1
        self.arrived.set()
        await self.opened.wait()

    async def wait_for_arrivals(self, count: int) -> int:
        while self.arrivals < count:
            self.arrived.clear()
            await self.arrived.wait()
        return self.arrivals

    def open(self) -> None:
        self.opened.set()


class GatedStrategy(TransferStrategy):
    """Delivers chunk ``start`` through ``inner``, waits at ``gate``, then the rest
    (nothing is prefetched before the gate opens)."""

    name = "test-gated"

    def __init__(self, inner: TransferStrategy, gate: Any) -> None:
        self.inner, self.gate = inner, gate

    def pack(self, source, files, config):  # type: ignore[no-untyped-def]
        raise NotImplementedError("only wraps an already packed payload")

    def iter_chunks(
        self, payload: Any, manifest: Manifest, start: int, stop: int, config: TransferConfig
    ) -> Iterator[Any]:
        yield from self.inner.iter_chunks(payload, manifest, start, min(start + 1, stop), config)
        ray.get(self.gate.arrive_and_wait.remote())
        yield from self.inner.iter_chunks(payload, manifest, start + 1, stop, config)


def gated(ckpt: ChunkedCheckpoint, gate: Any) -> ChunkedCheckpoint:
    handle = ckpt._handle
    assert handle is not None
    return ChunkedCheckpoint._from_handle(
        dataclasses.replace(handle, strategy=GatedStrategy(handle.strategy, gate))
    )


@dataclasses.dataclass
class HoldPackingAt:
    """A packing hook (``proven_read._after_span_read``) for a node agent: the first time
    a span at file offset ``offset`` or later has been read, arrive at ``gate`` and
    wait there until the test opens it. Packing then stops at a known chunk, so
    "while packing is still running" is a state, not a race."""

    offset: int
    gate: Any
    fired: bool = False

    def __call__(self, where: str, span: Any) -> None:
        if self.fired or span.file_offset < self.offset:
            return
        self.fired = True  # the agent packs on one thread (KNOBS.pack_threads)
        ray.get(self.gate.arrive_and_wait.remote())


def _set_packing_hook(agent: Any, hook: Any) -> None:
    from air_transfer.core import proven_read

    proven_read._after_span_read = hook


def hold_packing(agent: Any, hook: Any) -> None:
    """Install (or with None, clear) a packing hook in node agent ``agent``."""
    ray.get(agent.__ray_call__.remote(_set_packing_hook, hook))


class GatedSubmit(ChunkedStrategy):
    """``chunked`` packed by this process (its own layout: ``pack`` runs on the
    caller's submitting thread, for ``to_object_ref_async``), which waits for
    ``gate`` first: what happens before the checkpoint is handed over. Readers see
    plain ``chunked`` (it pickles as one). ``reset()`` before each use."""

    name = "test-gated-submit"
    layout = Layout.CUSTOM
    entered = threading.Event()
    gate = threading.Event()

    @classmethod
    def reset(cls) -> None:
        cls.entered, cls.gate = threading.Event(), threading.Event()

    def pack(self, request: PackRequest) -> Packed:
        GatedSubmit.entered.set()
        if not GatedSubmit.gate.wait(timeout=120):
            raise TimeoutError("the test never opened the gate")
        return super().pack(request)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ChunkedStrategy, ())
