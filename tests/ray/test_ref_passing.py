"""Every way a Ray user passes the ref of a transferred checkpoint around:
a top-level task argument, nested in a list, ``ray.get`` in the driver, an actor
method argument, a task's return value, and a restored checkpoint passed on again,
each for the sync ``to_object_ref()`` and the async ``to_object_ref_async().ref``.

Ray resolves a top-level ObjectRef argument to its value before the task runs, so
what ``to_object_ref`` puts must itself be a usable ``ray.train.Checkpoint``; and
``from_object_ref`` must accept the ref, that value, or a TransferHandle, so that
whichever of them a function is handed, the same line works.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.train import Checkpoint

from air_transfer import ChunkedCheckpoint, TransferConfig
from air_transfer.config import KiB
from air_transfer.extend import register_strategy
from tests.support.gates import GatedSubmit

pytestmark = pytest.mark.usefixtures("ray_local")

#: Several chunks, each its own object (chunked): the chunk refs travel nested in the
#: checkpoint's handle, which is what can go wrong when the checkpoint travels.
CONFIG = TransferConfig(chunk_bytes=64 * KiB, window=4, inline_max_bytes=0)
METADATA = {"epoch": 7, "note": "café"}

Share = Callable[[ChunkedCheckpoint], "ray.ObjectRef[Any]"]


def _sync(ckpt: ChunkedCheckpoint) -> ray.ObjectRef[Any]:
    return ckpt.to_object_ref(CONFIG)


def _async(ckpt: ChunkedCheckpoint) -> ray.ObjectRef[Any]:
    # The ref is handed on before packing is known to be done.
    return ckpt.to_object_ref_async(CONFIG).ref


SHARES: dict[str, Share] = {"sync": _sync, "async": _async}


@pytest.fixture(params=sorted(SHARES))
def share(request: pytest.FixtureRequest) -> Share:
    """How the driver makes the ref: ``to_object_ref()`` or ``to_object_ref_async().ref``."""
    return SHARES[request.param]


@pytest.fixture
def src(tmp_path: Path) -> Path:
    """A checkpoint of several chunks, with Ray Train's metadata file."""
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    (root / "model.bin").write_bytes(os.urandom(300 * KiB + 17))
    (root / "sub" / "optimizer.bin").write_bytes(os.urandom(70 * KiB))
    (root / "empty.txt").write_bytes(b"")
    Checkpoint.from_directory(str(root)).set_metadata(METADATA)
    return root


def digests(root: str | Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under ``root``."""
    out = {}
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            full = Path(dirpath, name)
            out[full.relative_to(root).as_posix()] = hashlib.sha256(full.read_bytes()).hexdigest()
    return out


# -- what a consumer does with what it was handed (runs in tasks, actors, the driver) --
def read(checkpoint: Checkpoint, target: str) -> dict[str, Any]:
    """Use ``checkpoint`` through the ``ray.train.Checkpoint`` API alone."""
    out: dict[str, Any] = {"is_train_checkpoint": isinstance(checkpoint, Checkpoint)}
    out["to_directory"] = digests(checkpoint.to_directory(target))
    with checkpoint.as_directory() as d:
        out["as_directory"] = digests(d)
    out["metadata"] = checkpoint.get_metadata()
    return out


def receive(received: Any, target: str) -> dict[str, Any]:
    """``from_object_ref`` on whatever was received, then read it; with the type that
    arrived and the transfer it belongs to (to tell re-sharing from repacking)."""
    ckpt = ChunkedCheckpoint.from_object_ref(received)
    return {
        **read(ckpt, target),
        "received": type(received).__name__,
        "transfer_id": ckpt.handle().transfer_id,
    }


def receive_top_level(received: Any, target: str) -> dict[str, Any]:
    """What a task or actor gets for a top-level ref argument: the checkpoint itself,
    usable directly and through ``from_object_ref``."""
    return {
        "direct": read(received, os.path.join(target, "direct")),
        "via_from_object_ref": receive(received, os.path.join(target, "via")),
    }


@ray.remote
def task_top_level(received: Any, target: str) -> dict[str, Any]:
    return receive_top_level(received, target)


@ray.remote
def task_nested(received: list[Any], target: str) -> dict[str, Any]:
    return receive(received[0], target)


@ray.remote
class Evaluator:
    """An actor handed checkpoints, as an evaluator in a training loop is."""

    def top_level(self, received: Any, target: str) -> dict[str, Any]:
        return receive_top_level(received, target)

    def nested(self, received: list[Any], target: str) -> dict[str, Any]:
        return receive(received[0], target)


@ray.remote
def pack_and_return_ref(src: str, mode: str) -> list[ray.ObjectRef[Any]]:
    """A task that packs a checkpoint and returns its ref, nested (a top-level ref
    in a return value would be resolved too). The chunks are owned by this task's
    worker, which Ray keeps alive while it owns objects in scope."""
    return [SHARES[mode](ChunkedCheckpoint.from_directory(src))]


@ray.remote
def pack_and_return_checkpoint(src: str, mode: str) -> ChunkedCheckpoint:
    """A task that packs a checkpoint and returns the transferred checkpoint itself."""
    ref = SHARES[mode](ChunkedCheckpoint.from_directory(src))
    return ChunkedCheckpoint.from_object_ref(ref)


@ray.remote
def reshare(received: ChunkedCheckpoint, mode: str) -> list[ray.ObjectRef[Any]]:
    """A task that passes a checkpoint it received on: its ``to_object_ref`` puts the
    same transfer again (no repacking: the source directory may be long gone)."""
    if mode == "sync":
        return [received.to_object_ref()]
    return [received.to_object_ref_async().ref]


@ray.remote
def relay(received: ChunkedCheckpoint, target: str) -> dict[str, Any]:
    """A task that hands the checkpoint it received to another task, by value."""
    result: dict[str, Any] = ray.get(task_top_level.remote(received, target))
    return result


def assert_restored(result: dict[str, Any], src: Path) -> None:
    expected = digests(src)
    assert result["is_train_checkpoint"]
    assert result["to_directory"] == expected
    assert result["as_directory"] == expected
    assert result["metadata"] == METADATA


def assert_top_level(result: dict[str, Any], src: Path) -> None:
    assert_restored(result["direct"], src)
    assert_restored(result["via_from_object_ref"], src)
    assert result["via_from_object_ref"]["received"] == "ChunkedCheckpoint"


# -- the tests ----------------------------------------------------------------------
def test_top_level_task_argument(src: Path, tmp_path: Path, share: Share) -> None:
    """``consume.remote(ref)``: Ray hands the task the checkpoint; it is a
    ``ray.train.Checkpoint`` as is, and ``from_object_ref(arg)`` works on it.
    (Defect: the task used to receive a TransferHandle and ``from_object_ref``
    raised ``TypeError: from_object_ref expects a ray.ObjectRef, got TransferHandle``.)"""
    ref = share(ChunkedCheckpoint.from_directory(src))
    assert_top_level(ray.get(task_top_level.remote(ref, str(tmp_path / "out"))), src)


def test_nested_task_argument(src: Path, tmp_path: Path, share: Share) -> None:
    """``consume.remote([ref])``: the task receives the ObjectRef itself."""
    ref = share(ChunkedCheckpoint.from_directory(src))
    result = ray.get(task_nested.remote([ref], str(tmp_path / "out")))
    assert result["received"] == "ObjectRef"
    assert_restored(result, src)


def test_ray_get_in_the_driver(src: Path, tmp_path: Path, share: Share) -> None:
    """``ray.get(ref)`` gives the checkpoint, ready to use; ``from_object_ref`` takes
    the ref, that value, or its TransferHandle alike."""
    ref = share(ChunkedCheckpoint.from_directory(src))
    value = ray.get(ref)
    assert isinstance(value, ChunkedCheckpoint)
    assert_restored(read(value, str(tmp_path / "direct")), src)
    for i, received in enumerate([ref, value, value.handle()]):
        result = receive(received, str(tmp_path / f"via{i}"))
        assert_restored(result, src)
        assert result["transfer_id"] == value.handle().transfer_id


def test_actor_method_arguments(src: Path, tmp_path: Path, share: Share) -> None:
    """An actor method gets the checkpoint for a top-level ref and the ref for a
    nested one; both restore."""
    ref = share(ChunkedCheckpoint.from_directory(src))
    evaluator = Evaluator.remote()  # type: ignore[attr-defined]
    try:
        top = evaluator.top_level.remote(ref, str(tmp_path / "top"))
        nested = evaluator.nested.remote([ref], str(tmp_path / "nested"))
        assert_top_level(ray.get(top), src)
        result = ray.get(nested)
        assert result["received"] == "ObjectRef"
        assert_restored(result, src)
    finally:
        ray.kill(evaluator)


@pytest.mark.parametrize("mode", sorted(SHARES))
def test_task_returns_the_ref_nested(src: Path, tmp_path: Path, mode: str) -> None:
    """A task packs and returns ``[ref]``: the driver and another task restore it."""
    [ref] = ray.get(pack_and_return_ref.remote(str(src), mode))
    assert_restored(receive(ref, str(tmp_path / "driver")), src)
    assert_top_level(ray.get(task_top_level.remote(ref, str(tmp_path / "task"))), src)


@pytest.mark.parametrize("mode", sorted(SHARES))
def test_task_returns_the_checkpoint(src: Path, tmp_path: Path, mode: str) -> None:
    """A task returns the transferred checkpoint itself: ``ray.get`` of the task's
    ref gives it, the task's ref works with ``from_object_ref``, and passing the
    task's ref to another task hands that task the checkpoint."""
    returned = pack_and_return_checkpoint.remote(str(src), mode)
    value = ray.get(returned)
    assert isinstance(value, ChunkedCheckpoint)
    assert_restored(read(value, str(tmp_path / "driver")), src)
    assert_restored(receive(returned, str(tmp_path / "from_ref")), src)
    assert_top_level(ray.get(task_top_level.remote(returned, str(tmp_path / "task"))), src)


def test_restored_checkpoint_passed_on_again(src: Path, tmp_path: Path, share: Share) -> None:
    """A checkpoint restored from a ref is shared again without repacking: by the
    driver, by a task that received it (``to_object_ref`` sync or async), and by a
    task handing it to another task; every copy is the same transfer, and the source
    directory is gone before any of them is read."""
    original = ChunkedCheckpoint.from_object_ref(share(ChunkedCheckpoint.from_directory(src)))
    transfer_id = original.handle().transfer_id
    expected = digests(src)
    original.manifest  # noqa: B018 -- waits for packing; then the source may go
    src_copy = tmp_path / "expected"
    src_copy.mkdir()
    for name in expected:
        (src_copy / name).parent.mkdir(parents=True, exist_ok=True)
        (src_copy / name).write_bytes((src / name).read_bytes())
    for name in expected:
        (src / name).unlink()

    again = receive(original.to_object_ref(), str(tmp_path / "driver"))
    assert again["transfer_id"] == transfer_id
    assert_restored(again, src_copy)
    for mode in SHARES:
        [ref] = ray.get(reshare.remote(original, mode))
        result = receive(ref, str(tmp_path / f"reshared-{mode}"))
        assert result["transfer_id"] == transfer_id
        assert_restored(result, src_copy)
    relayed = ray.get(relay.remote(original, str(tmp_path / "relayed")))
    assert_top_level(relayed, src_copy)
    assert relayed["via_from_object_ref"]["transfer_id"] == transfer_id


def test_from_object_ref_takes_the_future(src: Path, tmp_path: Path) -> None:
    """``from_object_ref(to_object_ref_async())``, forgetting ``.ref``, works too.
    (Defect: it raised ``TypeError: ... got a TransferFuture``.)"""
    future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(CONFIG)
    result = receive(future, str(tmp_path / "out"))
    assert result["received"] == "TransferFuture"
    assert_restored(result, src)


def test_a_future_passed_to_a_task_says_to_pass_its_ref(src: Path) -> None:
    """The future's completion lives in this process; passing it to a task is refused
    naming the remedy. (Defect: Ray's serializer failed on an RLock inside
    ``concurrent.futures.Future`` with no hint of ``.ref``.)"""
    future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(CONFIG)
    with pytest.raises(TypeError, match=r"cannot be pickled .* pass its \.ref"):
        task_nested.remote(future, "/nowhere")
    with pytest.raises(TypeError, match=r"pass its \.ref"):
        ray.put(future)
    assert future.result() is future.ref


def test_from_object_ref_names_what_it_got_instead(src: Path) -> None:
    """Anything else is refused with a TypeError naming what was received, and a
    checkpoint that was never transferred with what to do."""
    with pytest.raises(TypeError, match=r"holds a dict, not a checkpoint"):
        ChunkedCheckpoint.from_object_ref(ray.put({"a": 1}))
    with pytest.raises(TypeError, match=r"got a str, not a checkpoint"):
        ChunkedCheckpoint.from_object_ref("/some/dir")
    local = ChunkedCheckpoint.from_directory(src)
    never = r"a {} of the directory '{}' that was never transferred; transfer it with "
    with pytest.raises(TypeError, match=r"got " + never.format("ChunkedCheckpoint", src)):
        ChunkedCheckpoint.from_object_ref(local)
    with pytest.raises(TypeError, match=r"ObjectRef \w+ holds " + never.format("Checkpoint", src)):
        ChunkedCheckpoint.from_object_ref(ray.put(Checkpoint.from_directory(str(src))))


@pytest.mark.usefixtures("registry_restored")
def test_the_async_call_returns_before_its_packing_is_submitted(src: Path, tmp_path: Path) -> None:
    """The call returns while its strategy's ``pack`` still waits, on another
    thread (were it on the caller's, the call would block until the gate's timeout
    and raise); the ref, handed to a task meanwhile, resolves once it has run."""
    GatedSubmit.reset()
    register_strategy(GatedSubmit)
    future = ChunkedCheckpoint.from_directory(src).to_object_ref_async(
        CONFIG.replace(strategy=GatedSubmit.name)
    )
    assert GatedSubmit.entered.wait(timeout=60) and not future.done()
    reader = task_top_level.remote(future.ref, str(tmp_path / "out"))
    GatedSubmit.gate.set()
    assert_top_level(ray.get(reader), src)
    assert future.result(timeout=60) is future.ref
