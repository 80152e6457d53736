"""Node storage: a pyarrow filesystem whose files live on one node's disk and that
every node of the cluster reaches through that node's agent.

Modules by where they run: ``handler`` in the caller (the ``FileSystemHandler``),
``streams`` and ``chunk_writer`` on the wire (agent calls, chunked bodies), ``disk``,
``disk_tree``, ``disk_uploads`` and ``disk_reads`` on the storage node (inside its
agent), every path there confined to the root by ``confine``; ``sink`` in the agent
that writes a transferred checkpoint into storage.
"""
