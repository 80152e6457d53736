"""A checkpoint in transit: the handle (manifest + strategy + payload), the future
of its packing, the read-only filesystem view over it, starting a transfer where its
chunks will be owned, and the strategies that pack and carry the chunks. May import
``observe``, ``cluster``, ``core``, ``config`` and ``errors``.
"""
