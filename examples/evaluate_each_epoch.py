"""Send each epoch's checkpoint to an evaluator actor through the Ray object store.

A training loop writes a checkpoint directory every epoch and hands it to an
evaluator running elsewhere in the cluster: ``to_object_ref()`` packs the directory
into chunks and returns one small ObjectRef, which is passed to the actor like any
other argument. The actor receives the checkpoint itself (a ``ray.train.Checkpoint``)
and reads it with the usual ``as_directory()``.

With ``--async`` the loop does not wait for packing either: ``to_object_ref_async()``
returns as soon as packing has started, the evaluator can read while it runs, and the
loop waits only when it wants the directory back.

    python examples/evaluate_each_epoch.py --epochs 3 --size-mb 256 [--async]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import ray
import ray.train

from air_transfer import ChunkedCheckpoint, TransferConfig, TransferFuture

MiB = 1024 * 1024


@ray.remote
class Evaluator:
    """Scores checkpoints as they come; a real one would load a model."""

    def evaluate(self, checkpoint: ChunkedCheckpoint) -> dict[str, Any]:
        # Ray resolves a top-level ObjectRef argument, so this is the checkpoint
        # itself. (Nested in a list it stays a ref: use
        # ChunkedCheckpoint.from_object_ref(ref), which accepts either.)
        with checkpoint.as_directory() as d:
            weights = np.fromfile(Path(d) / "weights.bin", dtype=np.float32)
        return {"epoch": checkpoint.get_metadata()["epoch"], "score": float(weights.mean())}


def train_one_epoch(epoch: int, size_bytes: int) -> tuple[str, float]:
    """Stand-in for training: write this epoch's weights to a fresh checkpoint
    directory; returns the directory and the score the evaluator should find."""
    weights = np.random.default_rng(epoch).random(size_bytes // 4, dtype=np.float32)
    directory = tempfile.mkdtemp(prefix=f"epoch{epoch}-")
    weights.tofile(Path(directory) / "weights.bin")
    ray.train.Checkpoint.from_directory(directory).set_metadata({"epoch": epoch})
    return directory, float(weights.mean())


def main(
    epochs: int = 3,
    size_bytes: int = 256 * MiB,
    chunk_bytes: int = 32 * MiB,
    use_async: bool = False,
) -> list[dict[str, Any]]:
    """Train for ``epochs``, evaluating each epoch's checkpoint in an actor; returns,
    per epoch, the evaluator's result next to the score the loop expected."""
    started = not ray.is_initialized()
    if started:
        ray.init()
    try:
        config = TransferConfig(chunk_bytes=chunk_bytes)
        evaluator = Evaluator.remote()
        evaluations: list[ray.ObjectRef[dict[str, Any]]] = []
        expected: list[float] = []
        packing: tuple[TransferFuture, str] | None = None  # the previous epoch's, if async
        for epoch in range(epochs):
            directory, score = train_one_epoch(epoch, size_bytes)
            expected.append(score)
            if packing is not None:
                # The previous checkpoint packed while this epoch trained: done by
                # now, typically. result() raises what packing raised, if it failed.
                packing[0].result()
                shutil.rmtree(packing[1])
            checkpoint = ChunkedCheckpoint.from_directory(directory)
            if use_async:
                # Returns once packing has started; the evaluator may start reading
                # at once. The directory must stay until the future completes.
                future = checkpoint.to_object_ref_async(config)
                evaluations.append(evaluator.evaluate.remote(future.ref))
                packing = (future, directory)
            else:
                # Returns once every chunk is packed: the directory is free again.
                ref = checkpoint.to_object_ref(config)
                evaluations.append(evaluator.evaluate.remote(ref))
                shutil.rmtree(directory)
        if packing is not None:
            packing[0].result()
            shutil.rmtree(packing[1])
        # The chunks stay in the object store only as long as something refers to
        # them: here, until each evaluation has finished.
        results: list[dict[str, Any]] = ray.get(evaluations)
        for result, score in zip(results, expected, strict=True):
            result["expected_score"] = score
        return results
    finally:
        if started:
            ray.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--size-mb", type=int, default=256)
    parser.add_argument("--chunk-mb", type=int, default=32)
    parser.add_argument("--async", dest="use_async", action="store_true")
    args = parser.parse_args()
    for row in main(args.epochs, args.size_mb * MiB, args.chunk_mb * MiB, args.use_async):
        print(f"epoch {row['epoch']}: score {row['score']:.6f} ({row['expected_score']:.6f})")
