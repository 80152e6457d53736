"""Node storage: a pyarrow filesystem whose files live on one node's disk and that
every node of the cluster reaches through that node's agent.

Two rooms, by where the code runs: ``client`` in the caller's process (the pyarrow
handler, the same-node path, the upload and download streams) and ``server`` on the
storage node, inside its agent. They meet only through the agent. May import
``transfer``, ``observe``, ``cluster``, ``core``, ``config`` and ``errors``.
"""
