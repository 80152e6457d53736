"""Bytes that look like trained weights, without torch: normal draws at a weight's
scale, as fp32, fp16 or bf16 (fp32 rounded to nearest even, as torch converts)."""

from __future__ import annotations

import numpy as np

DTYPES = ("fp32", "bf16", "fp16")
WIDTH = {"fp32": 4, "bf16": 2, "fp16": 2}


def weights(dtype: str, count: int, seed: int = 0, scale: float = 0.02) -> bytes:
    """``count`` normal draws of standard deviation ``scale`` as ``dtype`` bytes."""
    values = np.random.default_rng(seed).normal(0.0, scale, count).astype(np.float32)
    if dtype == "fp32":
        return values.tobytes()
    if dtype == "fp16":
        return values.astype(np.float16).tobytes()
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()
