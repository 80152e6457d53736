"""What ``air_transfer.dcp`` needs, checked before anything imports it, so that a
missing piece fails with what to do: torch (the ``[torch]`` extra, or the user's own
build) and Ray Train v2."""

from __future__ import annotations

from air_transfer.cluster import _ray

_ray.require_train_v2()
try:
    import torch.distributed.checkpoint  # noqa: F401
except ImportError as e:
    raise ImportError(
        "air_transfer.dcp needs torch 2.9 or later with torch.distributed: install "
        "air-transfer with its [torch] extra (pip install '.[torch]' in a clone), or "
        "torch alone; for its CPU build, first: pip install torch --index-url "
        f"https://download.pytorch.org/whl/cpu ({e})"
    ) from e
