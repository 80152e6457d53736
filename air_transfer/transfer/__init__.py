"""A checkpoint in transit: the handle (manifest + strategy + payload), the future
of its packing, the read-only filesystem view over it, starting a transfer where its
chunks will be owned (``route``, ``start``), the strategies that say what a payload
is and the packers that say where and by whom it is packed. May import ``observe``,
``cluster``, ``core``, ``config`` and ``errors``.

Call order, as a newcomer follows it (as torch DCP's ``StorageWriter`` states its
own):

1. ``ChunkedCheckpoint.to_object_ref[_async]`` calls ``route.start_transfer``, which
   decides where the transfer starts: this thread, this process's submitting thread
   (the caller gets a relay's ref at once: ``relay``, ``Relays.take``), or this
   node's agent, which then owns the chunks (``owner="node"``:
   ``NodeOwnedTransfers.submit_transfer``, held by a lease: ``cluster.transfer_leases``).
2. ``start.prepare`` scans the source and checks it (``core.scan``), on the caller's
   thread, so bad input raises at the call.
3. ``start.start`` picks a strategy (``strategies.registry.select_strategy``, by size
   against the free object store, unless the config names one) and a packer
   (``packers.select_packer``, from the strategy's ``layout``: ``HERE``, the agent's
   tasks ``agent_tasks``, ``shared_pack`` with a blocking caller, or ``live_chunks``
   reused), starts packing (the agent's ``PackingService``), and makes the
   ``handle.TransferHandle``: the manifest, the strategy and its payload, whose
   checksums may still be refs.
4. The checkpoint is put (``start.Started.put``); ``future.TransferFuture`` completes
   when every chunk is packed (``PackingService.packed``) and the source is free.
5. A reader anywhere unpickles the handle (a few KB of manifest and refs) and reads:
   ``TransferHandle.write_to`` (``to_directory``: chunks in order, a bounded window
   ahead, each checked and written into staging, published only when whole),
   ``iter_chunks``, or ``fs_view``'s pyarrow view (listings from the manifest, file
   bodies through the chunk reader).
"""
