"""Ray Train's private API, in one of the three modules that touch Ray's private API
(``_ray_core`` holds Ray core's: the GCS, the object store, workers; ``_ray_hooks``
Train's checkpoint manager and storage context, hooked).

Ray Train's public API has no way to name a checkpoint's temporary directory, count
a worker's reports, copy settings to its workers, or store and restore a report's
checkpoint through node storage; these names are private and may move between Ray
releases. Keeping every such use here means an upgrade breaks one module, and
``_ray_names`` lists them for a test that checks that each name still exists in the installed Ray.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray.train import Checkpoint

logger = logging.getLogger(__name__)


def temporary_checkpoint_dir(checkpoint: Checkpoint) -> str:
    """The fresh local directory ``ray.train.Checkpoint.to_directory()`` uses when
    given no path, so ours behaves the same."""
    return str(checkpoint._get_temporary_checkpoint_dir())


def checkpoint_uuid(checkpoint: Checkpoint) -> uuid.UUID:
    """The id a ``ray.train.Checkpoint`` names its temporary directory after; kept
    across pickling so copies of a checkpoint share their download directory."""
    value: uuid.UUID = checkpoint._uuid
    return value


def train_reports_made() -> int:
    """How many reports this Ray Train worker has made, by Train's own count. A
    report Train skips (a worker failed at its checkpoint-name barrier: it returns
    without uploading) leaves the count as it was, and says so no other way."""
    from ray.train.v2._internal.execution.context import get_train_context

    return int(get_train_context().report_call_index)


def require_train_v2() -> None:
    """ImportError saying what to do when Ray Train v1 is selected
    (``RAY_TRAIN_V2_ENABLED=0``): the library reports, uploads and hooks through
    Train v2 (Ray's default), and v1 lacks its names (``CheckpointUploadMode``...),
    which would otherwise fail an import deep inside with a bare ImportError. Ray
    decides it by this private function."""
    from ray.train.v2._internal.constants import is_v2_enabled

    if not is_v2_enabled():
        raise ImportError(
            "air-transfer needs Ray Train v2, Ray's default; RAY_TRAIN_V2_ENABLED=0 in "
            "this process's environment selects Train v1, which it does not support: "
            "unset RAY_TRAIN_V2_ENABLED (or set it to 1)"
        )


def propagate_to_train(names: Iterable[str]) -> bool:
    """Have Ray Train copy the environment variables ``names`` (those set) from the
    driver to its controller and from the controller to its workers, as it copies
    its own ``RAY_TRAIN_*`` settings: the one list it copies
    (``ENV_VARS_TO_PROPAGATE``, read when a run starts its controller and its
    workers) is private. True if added; a Ray without it is logged."""
    names = list(names)
    try:
        from ray.train.v2._internal import constants

        propagated: Any = constants.ENV_VARS_TO_PROPAGATE  # private, a set
        propagated.update(names)
    except (ImportError, AttributeError) as e:
        logger.warning(
            "air-transfer: Ray Train will not copy air-transfer's settings (%s) to its "
            "controller and workers (%s); set them in the job's runtime_env instead",
            ", ".join(names),
            e,
        )
        return False
    return True
