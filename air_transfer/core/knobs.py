"""Internal knobs in one place (torchsnapshot keeps its in ``knobs.py``).

``TransferConfig`` holds what a user tunes per transfer; these are the numbers the
implementation was measured and built around, each with the reason for its value.
They are validated once, like ``TransferConfig``, so an edit that breaks an
invariant fails at import, not deep inside a transfer. Plain Python.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

MiB = 1024 * 1024


_KIND, _HIGH = "air_transfer_knob", "air_transfer_knob_high"


def count(default: int) -> int:
    """A knob that counts (threads, bytes, chunks, buffers): a positive int."""
    return field(default=default, metadata={_KIND: "count"})


def up_to(default: float, high: float = math.inf) -> float:
    """A knob of time or share: above 0 and at most ``high`` (a poll or a wait that an
    edit stretched to hours would look like a hang)."""
    return field(default=default, metadata={_KIND: "up_to", _HIGH: high})


@dataclass(frozen=True)
class Knobs:
    """Implementation constants (read ``KNOBS``; tests may build their own)."""

    #: Buffer of the ``io.BufferedReader`` over a file inside the chunk stream (and
    #: over node-storage reads): big enough that pyarrow's small reads do not each
    #: walk the chunk generator, small next to a chunk.
    read_buffer_bytes: int = count(1 * MiB)
    #: Threads fetching chunks ahead of the reader; gets beyond this only queue: Ray
    #: pulls a few large objects at a time per node anyway, and threads cost memory.
    max_fetch_threads: int = count(8)
    #: Threads of a node agent: enough that every worker of a node can call it at once
    #: (metadata calls, upload chunks, streams), each call short or backpressured.
    agent_max_concurrency: int = count(32)
    #: Threads of a node agent that pack chunks: each holds ``pack_task_bytes`` of chunk
    #: buffers, so they bound the agent's private memory. One packs ~2 GB/s here
    #: (read, checksum, copy into the store), faster than the disks it feeds, and
    #: leaves the other core of a 2-core node to the reader.
    pack_threads: int = count(1)
    #: Threads of a node agent that hold a checkpoint's ref open until the caller's
    #: background thread has submitted its packing (``transfer.relay``): each waits
    #: tens of milliseconds per ``to_object_ref_async`` call; more calls at once queue.
    relay_threads: int = count(16)
    #: How often such a wait checks that its caller still runs (a caller that died
    #: before handing over its checkpoint frees the thread).
    relay_poll_s: float = up_to(1.0, 60)
    #: How long one reader of a relayed ``streamed`` transfer may hold up the others
    #: (``transfer.relay_stream``: they move in lockstep) before it is dropped and reads
    #: the transfer itself: far above a chunk's write, so only a stuck reader is.
    relay_stall_s: float = up_to(60.0, 3600)
    #: Chunks packed by one task each before tasks take ``pack_task_bytes`` of them: readers
    #: get the first chunks as early as possible.
    single_chunk_tasks: int = count(8)
    #: Bytes of chunks per packing task after those (at least one chunk): submitting
    #: a task costs 0.2-0.6 ms (Ray's own overhead, more while the agent is busy on
    #: a 2-core node), so four 32 MiB chunks per task keep an 8 GB checkpoint's
    #: submission at ~40 ms (two: 85 ms), paid by the caller's submitting thread
    #: (``transfer.route``), not by the call; the packing thread holds them all.
    pack_task_bytes: int = count(128 * MiB)
    #: A chunk of one local file and at least this many bytes is packed as a view of
    #: the file mapped under a read lease (``core.mapped``), without a copy; smaller
    #: ones, and chunks of several files, are read into the packing buffer.
    mapped_chunk_min_bytes: int = count(1 * MiB)
    #: How often the lease watcher (``core.lease_breaks``) also looks for a break of
    #: a read lease whose signal it missed (one started while the lease was being
    #: taken): a writer then waits this long at most, far inside the kernel's
    #: ``lease-break-time`` (45 s), after which a stalled packer would crash.
    lease_break_poll_s: float = up_to(0.5, 5)
    #: Chunk size of node-storage reads (kept within ``chunk_bytes`` and twice that):
    #: Ray Train copies checkpoints with pyarrow in 64 MiB reads
    #: (``_pyarrow_fs_copy_files``), and a read that one chunk holds is served as a
    #: view of it, without a copy.
    storage_read_chunk_bytes: int = count(64 * MiB)
    #: Reusable read buffers of the packing reader: one being filled, one waiting in
    #: the hand-off, one held by the caller (memory: 3 x chunk_bytes).
    pack_ring_buffers: int = count(3)
    #: A node-storage chunk nobody asked for in this long leaves the storage agent's
    #: cache (``storage.server.chunk_cache``): readers of one checkpoint that start
    #: within it share its chunks; afterwards the store is not held for nobody.
    read_cache_idle_s: float = up_to(30.0)
    #: A reader of a node-storage checkpoint that has not said it is done this long
    #: after it last asked is taken for dead: what it read is then kept only within
    #: the budget again. Restores of the largest checkpoints take minutes.
    read_lease_s: float = up_to(900.0)
    #: ``streamed`` rather than ``chunked`` above this share of the packing node's
    #: free object store: chunked would start spilling (Ray spills at 0.8 full).
    stream_above_store_fraction: float = up_to(0.8, 1)
    #: A transfer's progress bar is drawn only once it has run this long: a
    #: checkpoint that moves in under a second (most small ones) prints nothing.
    progress_delay_s: float = 1.0
    #: How often a ``TransferFuture`` that waits (or has callbacks) checks that the
    #: Ray session it was started in still runs: Ray's future of an object of a
    #: session that ended (``ray.shutdown()``) never completes, so a wait would hang.
    session_poll_s: float = up_to(0.2, 10)
    #: How often a process that asked for ``owner="node"`` transfers checks which of
    #: them it still references, and lets their agent drop its lease on the others
    #: (``air_transfer.leases``): the delay before a released checkpoint is freed.
    lease_poll_s: float = up_to(1.0, 60)
    #: How often a storage node's agent with uploads in progress asks whether their
    #: writers still run (one call per writers' node): the staging file of a writer
    #: killed mid-upload is removed this long after, at most, plus the call.
    upload_reap_s: float = up_to(2.0, 600)

    def __post_init__(self) -> None:
        for knob in fields(self):
            value = getattr(self, knob.name)
            if knob.metadata.get(_KIND) == "count":
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"knob {knob.name} must be a positive int, got {value!r}")
            elif knob.metadata.get(_KIND) == "up_to":
                high = knob.metadata[_HIGH]
                if not 0 < value <= high:
                    within = "> 0" if high == math.inf else f"in (0, {high:g}]"
                    raise ValueError(f"knob {knob.name} must be {within}, got {value!r}")
        if self.pack_ring_buffers < 3:
            raise ValueError(
                "knob pack_ring_buffers must be >= 3: the reader fills one buffer while "
                "one waits in the hand-off and the caller holds one"
            )
        if not 0 <= self.progress_delay_s < 3600:
            raise ValueError(
                f"knob progress_delay_s must be in [0, 3600), got {self.progress_delay_s!r}"
            )


KNOBS = Knobs()
