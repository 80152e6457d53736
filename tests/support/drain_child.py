"""A drain in a process of its own, for a test to kill mid-upload: drains node storage
``root`` into ``uri`` at ``bytes_per_s`` and waits to be killed.

    python -m tests.support.drain_child ROOT URI BYTES_PER_S
"""

from __future__ import annotations

import sys
import threading

from air_transfer.storage.durable.settings import DrainSettings
from air_transfer.storage.durable.target import DurableTarget
from air_transfer.storage.durable.tombstones import MemoryTombstones
from air_transfer.storage.server.drain.loop import Drainer
from air_transfer.storage.server.drain.passes import Drain


def main() -> None:
    root, uri, rate = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mib = 1024 * 1024  # parts of S3's smallest size: the upload shows from its first
    settings = DrainSettings(chunk_bytes=mib, bytes_per_s=rate, concurrency=1, part_bytes=5 * mib)
    target = DurableTarget.parse(uri)
    drainer = Drainer(Drain(root, target, settings, MemoryTombstones(), threading.Lock()))
    drainer.start().request()
    print("draining", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
