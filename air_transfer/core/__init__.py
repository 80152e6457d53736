"""The Ray-free core: what a checkpoint is and how its bytes are read, proven and
written, on one machine. The manifest and its checks, checksums, symlink resolution,
the directory scan, chunk plans (per-file ones too), proven reads, the writer,
merge, publish and locks, reuse of stored bytes (clones, links),
the one deep-tree walker, ``O_DIRECT``, the durable tier's chunk codecs and the
internal knobs. May import only ``air_transfer.config`` and ``air_transfer.errors``
(and the standard library, numpy, xxhash, pyarrow, and zstandard where installed: the
``[codec]`` extra); never Ray (an import-linter contract).
"""
