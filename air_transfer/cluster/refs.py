"""Names for the ObjectRefs a transfer is made of, by what they resolve to: the
lowest layer that may import Ray names them, for every layer above."""

from __future__ import annotations

from typing import Any

import numpy as np
import ray

#: A chunk in the object store: a numpy uint8 array of its bytes.
ChunkRef = ray.ObjectRef[np.ndarray]
#: What a packing task returns in a chunk checksum's place: the checksum, or the
#: error packing failed with (returned, not raised: ``transfer.packing_service``).
Checksum = str | BaseException
#: The ref of a chunk's checksum, as a packing task returns it.
ChecksumRef = ray.ObjectRef[Checksum]
#: A chunk's checksum while packing may run: known, or the ref of one being packed.
PendingChecksum = str | ChecksumRef
#: What ``store_chunks`` returns per chunk: its checksum, None where it is to be
#: taken of the stored copy, or the packing error.
Status = str | BaseException | None
StatusRef = ray.ObjectRef[Status]
#: The completion of a transfer's packing (``PackingService.packed``): resolves to
#: every checksum and status once every chunk is packed, or raises the first
#: packing error.
DoneRef = ray.ObjectRef[tuple[Status, ...]]
#: The ref of a transferred checkpoint: a ``ChunkedCheckpoint``, or, from a relay,
#: the error submitting its packing raised. Any: the checkpoint's class is defined
#: above every layer that passes its ref along.
CheckpointRef = ray.ObjectRef[Any]
