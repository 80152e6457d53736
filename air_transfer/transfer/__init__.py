"""A checkpoint in transit: the handle (manifest + strategy + payload), the future
of its packing, the read-only filesystem view over it, starting a transfer where its
chunks will be owned (``route``, ``start``), the strategies that say what a payload
is and the packers that say where and by whom it is packed. May import ``observe``,
``cluster``, ``core``, ``config`` and ``errors``.
"""
