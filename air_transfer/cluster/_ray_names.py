"""Every name of Ray's private API that air-transfer uses, as (module, dotted
attribute), in one table that a test pins against the installed Ray: a Ray release
that moves one fails the test that names it, before any run does. Only the three
modules below ``cluster`` that touch Ray's private API use them: ``_ray`` (Ray
Train's), ``_ray_core`` (Ray core's: the GCS, the object store, workers) and
``_ray_hooks`` (Train's checkpoint manager and storage context, hooked).
"""

PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    # _ray
    ("ray.train", "Checkpoint._get_temporary_checkpoint_dir"),
    ("ray.train.v2._internal.execution.context", "TrainContext.report"),
    ("ray.train.v2._internal.execution.context", "TrainContext.report_call_index"),
    ("ray.train.v2._internal.execution.context", "get_train_context"),
    ("ray.train.v2._internal.constants", "ENV_VARS_TO_PROPAGATE"),
    ("ray.train.v2._internal.constants", "get_env_vars_to_propagate"),
    ("ray.train.v2._internal.constants", "is_v2_enabled"),
    # _ray_core
    ("ray._private.state", "available_resources_per_node"),
    ("ray._private.state", "actors"),
    ("ray._private.worker", "global_worker"),
    ("ray._raylet", "CoreWorker.get_all_reference_counts"),
    ("ray.experimental.internal_kv", "_internal_kv_put"),
    ("ray.experimental.internal_kv", "_internal_kv_get"),
    ("ray.experimental.internal_kv", "_internal_kv_list"),
    ("ray.experimental.internal_kv", "_internal_kv_del"),
    ("ray._private.state", "state"),
    ("ray._private.state", "GlobalState._connect_and_get_accessor"),
    ("ray._raylet", "GlobalStateAccessor.get_worker_info"),
    ("ray.core.generated.gcs_pb2", "WorkerTableData"),
    ("ray._private.services", "canonicalize_bootstrap_address"),
    ("ray._raylet", "InnerGcsClient.standalone"),
    ("ray._private.state", "GlobalState.get_draining_nodes"),
    # _ray_hooks
    ("ray.train.v2._internal.execution.storage", "StorageContext.persist_current_checkpoint"),
    ("ray.train.v2._internal.execution.storage", "StorageContext.build_checkpoint_path_from_name"),
    ("ray.train._checkpoint", "_download_from_fs_path"),
    ("ray.train.v2._internal.execution.context", "TrainContext.report"),
    ("ray.train.v2._internal.execution.context", "TrainContext.report_call_index"),
    ("ray.train.v2._internal.execution.context", "TrainContext.get_all_reported_checkpoints"),
    ("ray.train.v2._internal.execution.context", "TrainContext.get_checkpoint"),
    ("ray.train.v2._internal.execution.context", "TrainContext.get_world_rank"),
    ("ray.train.v2._internal.execution.context", "TrainContext.get_world_size"),
    (
        "ray.train.v2._internal.execution.checkpoint.checkpoint_manager",
        "CheckpointManager.before_worker_group_shutdown",
    ),
    (
        "ray.train.v2._internal.execution.checkpoint.checkpoint_manager",
        "CheckpointManager.before_init_train_context",
    ),
    (
        "ray.train.v2._internal.execution.checkpoint.checkpoint_manager",
        "CheckpointManager.register_checkpoint",
    ),
    (
        "ray.train.v2._internal.execution.checkpoint.checkpoint_manager",
        "CheckpointManager.after_report",
    ),
    ("ray.train.v2._internal.execution.training_report", "_TrainingReport"),
    ("ray.train.v2._internal.execution.worker_group.worker_group", "WorkerGroup.get_workers"),
)
