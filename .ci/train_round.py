"""One Ray Train round through node storage on a local Ray: what every Ray minor
version air-transfer supports must run (``.ci/ray_versions.py`` runs it in a fresh
environment per version; the test suite runs much more on the version CI installs).

Two runs of one name on ``storage_filesystem(root=...)``, two workers each. The
first saves two torch DCP checkpoints (``air_transfer.dcp.report``: the report
hooks). The second resumes: ``air_transfer.dcp.load`` reads the latest back, Ray's
``Checkpoint.to_directory`` downloads it (the download hook), and each rank reports
a plain directory checkpoint (the upload hook), read back on the driver. Exit status
0 when every check holds.

    python .ci/train_round.py
"""

from __future__ import annotations

import os
import sys
import tempfile

import ray
import ray.train
import torch
from ray.train.torch import TorchTrainer, prepare_model
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import air_transfer
import air_transfer.dcp


def train_loop(config: dict[str, int]) -> None:
    model = prepare_model(torch.nn.Linear(8, 1))
    optim = torch.optim.Adam(model.parameters())
    model_sd, optim_sd = get_state_dict(model, optim)
    state = {"model": model_sd, "optim": optim_sd, "step": 0}
    loaded = air_transfer.dcp.load(state)
    if loaded:
        set_state_dict(
            model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"]
        )
    start = int(state["step"])
    latest = ray.train.get_checkpoint()
    downloaded = sorted(os.listdir(latest.to_directory())) if latest is not None else []
    for step in range(start, config["until"]):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        optim.zero_grad()
        loss.backward()
        optim.step()
        model_sd, optim_sd = get_state_dict(model, optim)
        state = {"model": model_sd, "optim": optim_sd, "step": step + 1}
        air_transfer.dcp.report({"loss": loss.item()}, state_dict=state)
    if config["plain"]:
        rank = ray.train.get_context().get_world_rank()
        with tempfile.TemporaryDirectory() as where:
            with open(os.path.join(where, f"rank{rank}.txt"), "w") as f:
                f.write(f"rank {rank} resumed at step {start}")
            metrics = {"loaded": loaded, "start": start, "downloaded": downloaded}
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(where))


def fit(root: str, until: int, plain: bool) -> ray.train.Result:
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"until": until, "plain": plain},
        scaling_config=ray.train.ScalingConfig(num_workers=2),
        run_config=ray.train.RunConfig(
            name="round",
            storage_path=root,
            storage_filesystem=air_transfer.storage_filesystem(root=root),
        ),
    )
    return trainer.fit()


def main() -> None:
    root = os.path.abspath(tempfile.mkdtemp(prefix="train-round-"))
    print(f"Ray {ray.__version__}, torch {torch.__version__}, node storage at {root}")
    first = fit(root, until=2, plain=False)
    assert first.error is None, first.error
    second = fit(root, until=3, plain=True)
    assert second.error is None, second.error
    metrics = second.metrics
    assert metrics["loaded"] is True and metrics["start"] == 2, metrics
    assert ".metadata" in metrics["downloaded"], metrics
    assert second.checkpoint is not None
    with second.checkpoint.as_directory() as where:
        texts = {name: open(os.path.join(where, name)).read() for name in os.listdir(where)}
    assert texts == {f"rank{r}.txt": f"rank {r} resumed at step 2" for r in (0, 1)}, texts
    fs = air_transfer.storage_filesystem(root=root)
    listed = air_transfer.list_checkpoints(fs, root)
    assert [c.dcp for c in listed] == [True, True, True, False], listed
    print(f"train round ok: {len(listed)} checkpoints, resumed at step 2, read back")


if __name__ == "__main__":
    sys.exit(main())
