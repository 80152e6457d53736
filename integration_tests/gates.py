"""Make a transfer stop at a known point, so a fault can be injected mid-transfer
without sleeps: the reader fetches the first chunk, announces it at a Gate, and
fetches nothing more until the test opens the gate."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator
from typing import Any

import ray

from air_transfer import ChunkedCheckpoint, TransferConfig, TransferStrategy
from air_transfer.manifest import Manifest


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
