"""Ray Tune's own cross-node directory sync, driven as Tune drives it, for the
``tune`` contender; and the pid of an actor still in its constructor.

These are Ray's private names (``ray.tune.utils.file_transfer``, the GCS actor
table): the tools keep their own, pinned by ``tests/unit/test_bench_ray_names.py``,
so the library's ``cluster._ray`` holds only what the library needs.
"""

from __future__ import annotations

from typing import Any

#: Every private name used below, as (module, dotted attribute): pinned by a test.
PRIVATE_NAMES: tuple[tuple[str, str], ...] = (
    ("ray._private.state", "actors"),
    ("ray.actor", "ActorHandle._actor_id"),
    ("ray.tune.utils.file_transfer", "_PackActor"),
    ("ray.tune.utils.file_transfer", "_force_on_node"),
    ("ray.tune.utils.file_transfer", "_unpack_from_actor"),
    ("ray.tune.utils.file_transfer", "_DEFAULT_CHUNK_SIZE_BYTES"),
)


def actor_pid(handle: Any) -> int | None:
    """The pid of an actor's process, known to the GCS as soon as a worker is leased
    (before the actor is ALIVE); None until then. Used by the bench to sample a Tune
    pack actor that is still inside its constructor."""
    from ray._private import state

    pid = state.actors(handle._actor_id.hex()).get("Pid")
    return int(pid) if pid else None


def tune_pack_actor(source_dir: str, node_id: str) -> Any:
    """Ray Tune's ``_PackActor`` for ``source_dir``, started on ``node_id`` as
    ``sync_dir_between_nodes`` starts it (the bench's ``tune`` contender runs Tune's
    own code unchanged). ``max_size_bytes=None`` lifts Tune's 1 GiB refusal."""
    from ray.tune.utils import file_transfer

    ft: Any = file_transfer  # private names, untyped on purpose
    return ft._PackActor.options(num_cpus=0, **ft._force_on_node(node_id)).remote(
        source_dir=source_dir,
        files_stats=None,
        chunk_size_bytes=ft._DEFAULT_CHUNK_SIZE_BYTES,
        max_size_bytes=None,
    )


def tune_unpack(pack_actor: Any, target_dir: str) -> None:
    """The body of Tune's ``_unpack_from_actor`` task, run in this process."""
    from ray.tune.utils import file_transfer

    ft: Any = file_transfer
    ft._unpack_from_actor._function(pack_actor, target_dir)
