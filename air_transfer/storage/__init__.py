"""Node storage: a pyarrow filesystem whose files live on one node's disk and that
every node of the cluster reaches through that node's agent.

Modules by where they run: ``handler`` in the caller (the ``FileSystemHandler``),
``streams`` on the wire (agent calls, chunked bodies), ``disk`` and ``disk_uploads``
on the storage node (inside its agent), ``sink`` in the agent that writes a
transferred checkpoint into storage.
"""
