"""The Trainer config option: Ray Train on several nodes with no shared storage.

Since Ray 2.7 every node must reach ``RunConfig(storage_path)`` (ray-project/ray#37177,
#46913). ``storage_filesystem()`` gives Train one: the files live on one node's disk
and every worker reaches them through that node's agent, in chunks; ``run_config()``
makes the whole ``RunConfig``, the root said once::

    air_transfer.run_config(root="/abs/dir", name="run")  # a ray.train.RunConfig

``checkpoint_upload_fn`` is the per-report plug point instead, for a run that keeps
its own storage: ``ray.train.report(..., checkpoint_upload_fn=checkpoint_upload_fn)``.

The rooms: ``filesystem`` (the entrance), ``settings`` and ``root`` (checked there,
once), ``run_config`` (a ``RunConfig`` around it); ``plan`` and ``upload`` (how a
checkpoint is stored, decided then carried out); ``hooks`` (Ray Train's own copies,
rerouted); ``state`` (where storage stands).
"""

from air_transfer.cluster import _ray
from air_transfer.core import environ
from air_transfer.train.filesystem import storage_filesystem
from air_transfer.train.run_config import run_config
from air_transfer.train.state import (
    replica_status,
    run_storage_filesystem,
    storage_state,
    wait_durable,
)
from air_transfer.train.upload import checkpoint_upload_fn, upload_checkpoint

_ray.require_train_v2()
# The settings a user sets on the driver reach Train's controller and workers with
# Ray Train's own: this package is imported by the driver (storage_filesystem,
# checkpoint_upload_fn, air_transfer.dcp) and by the controller (a run's storage).
_ray.propagate_to_train(environ.SETTINGS)

__all__ = [
    "checkpoint_upload_fn",
    "replica_status",
    "run_config",
    "run_storage_filesystem",
    "storage_filesystem",
    "storage_state",
    "upload_checkpoint",
    "wait_durable",
]
