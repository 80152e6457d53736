"""Node storage, the storage node's side: what the agent runs on its own disk.
Metadata operations, uploads arriving in chunks, reads, the shared chunk cache, tree
walks and removal, the sink that writes a transferred checkpoint into a run's
storage, and incremental stores and upload streams (what earlier checkpoints hold
reused, the rest sent). Every path is confined to the root the caller names (``core.confine``).
"""
