"""The ``air-transfer`` command line end to end, on the shared two-node cluster: a Ray
Train run (its worker on ``node_a``) and a torch DCP save write node storage on the
head with a durable tier (a local directory, ``file://``); each command then runs as
a user runs it, ``python -m air_transfer.cli ... --address``, in a process of its
own: ``ls`` finds the run's checkpoints with their size and state, ``verify`` reads
one back and checks the durable tier's records, ``cp`` copies the run out and back,
byte for byte, with a bar, and ``clean`` removes what a dead writer left (a dry run
first). The failures (a corrupted durable copy, a truncated DCP shard, a copy onto an
existing path) run in this process, through ``main``, to keep the tier short."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs
import pytest
import ray.train
import torch
import torch.distributed.checkpoint as dcp
from ray.cluster_utils import Cluster
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

import air_transfer
from air_transfer.cli.main import main
from air_transfer.cli.output import human_bytes
from air_transfer.dcp import NodeStorageWriter
from tests.support.checkpoints import MiB
from tests.support.cli import air_transfer as run_cli
from tests.support.cli import air_transfer_json, files_under
from tests.support.train_fns import train_loop

SIZE = 2 * MiB + 7
ON_NODE_A = {"CPU": 1, "node_a": 0.01}


@dataclass(frozen=True)
class Run:
    """Node storage ``root`` (on the head), its durable tier ``uri`` at ``tier``, the
    run's directory and its two checkpoints, and a DCP checkpoint saved beside."""

    root: Path
    tier: Path
    uri: str
    run: Path
    checkpoints: tuple[Path, ...]
    dcp: Path
    fs: pafs.FileSystem


def save_dcp(fs: pafs.FileSystem, path: Path, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    state = {"w": torch.randn(256, 256, generator=generator), "step": torch.tensor(seed)}
    dcp.save(state, storage_writer=NodeStorageWriter(str(path), fs), no_dist=True)


@pytest.fixture(scope="module")
def run(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    top = tmp_path_factory.mktemp("cli")
    root, tier = top / "node-storage", top / "durable"
    root.mkdir()
    tier.mkdir()
    uri = f"file://{tier}"
    fs = air_transfer.storage_filesystem(root=str(root), durable=uri)
    DataParallelTrainer(
        train_loop,
        train_loop_config={"size": SIZE, "steps": 2},
        scaling_config=ray.train.ScalingConfig(num_workers=1, resources_per_worker=ON_NODE_A),
        run_config=ray.train.RunConfig(
            name="cli-run", storage_path=str(root / "experiments"), storage_filesystem=fs
        ),
    ).fit()
    save_dcp(fs, root / "dcp" / "step_1", seed=1)
    air_transfer.wait_durable(fs, timeout=120)
    run_dir = root / "experiments" / "cli-run"
    checkpoints = tuple(sorted(p for p in run_dir.glob("checkpoint_*") if p.is_dir()))
    assert len(checkpoints) == 2
    yield Run(root, tier, uri, run_dir, checkpoints, root / "dcp" / "step_1", fs)


def test_ls_lists_the_runs_checkpoints_with_size_age_and_state(cluster: Cluster, run: Run) -> None:
    listed = air_transfer_json(cluster.address, "ls", str(run.root), "--durable", run.uri)
    found = {c["path"]: c for c in listed["checkpoints"]}
    expected = [*map(str, run.checkpoints), str(run.dcp)]
    assert sorted(found) == sorted(expected)
    for path in expected:
        on_disk = files_under(Path(path))
        entry = found[path]
        assert (entry["files"], entry["bytes"]) == (len(on_disk), sum(map(len, on_disk.values())))
        assert (entry["copies"], entry["durable"], entry["tier"]) == (1, True, "durable")
        assert 0 <= entry["age_s"] < 3600
        assert entry["dcp"] == (path == str(run.dcp))
        assert entry["run"] == ("dcp" if entry["dcp"] else "experiments/cli-run")
    table = run_cli(cluster.address, "ls", f"node://head{run.root}")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["CHECKPOINT", "SIZE", "FILES", "AGE", "KIND", "STATE"]
    assert sorted(line.split()[0] for line in lines[1:]) == sorted(expected)
    # Without --durable too, each checkpoint's tier, asked of the agent that drains the root
    assert all(line.endswith("  durable") for line in lines[1:]), table.stdout


def test_the_python_api_lists_what_ls_prints(cluster: Cluster, run: Run) -> None:
    """``air_transfer.list_checkpoints``: ``ls --json``'s records, typed, from the
    run's filesystem or from one opened on the root without its durable tier."""
    listed = air_transfer_json(cluster.address, "ls", str(run.root))["checkpoints"]
    plain = air_transfer.storage_filesystem(root=str(run.root))
    for fs in (run.fs, plain):
        infos = air_transfer.list_checkpoints(fs, str(run.root))
        assert all(isinstance(i.state, air_transfer.StorageState) for i in infos)
        assert [i.tier for i in infos] == ["durable"] * 3
        records = [{**i.to_dict(), "age_s": None} for i in infos]
        assert records == [{**r, "age_s": None} for r in listed]
    with pytest.raises(FileNotFoundError, match="no directory of node storage"):
        air_transfer.list_checkpoints(plain, str(run.root / "nowhere"))


def test_verify_reads_a_checkpoint_back_and_checks_the_durable_records(
    cluster: Cluster, run: Run
) -> None:
    rel = str(run.checkpoints[-1].relative_to(run.root))
    report = air_transfer_json(cluster.address, "verify", str(run.root), rel, "--durable", run.uri)
    assert report["ok"] and not report["problems"]
    assert {f["path"] for f in report["files"]} == {
        f"{run.checkpoints[-1]}/{name}" for name in files_under(run.checkpoints[-1])
    }
    assert {(f["copies_read"], f["durable"]) for f in report["files"]} == {(1, "verified")}


def test_verify_fails_on_a_corrupted_durable_copy_and_a_truncated_dcp_shard(
    cluster: Cluster, run: Run, capsys: pytest.CaptureFixture[str]
) -> None:
    ckpt = run.checkpoints[0]
    copy = run.tier / ckpt.relative_to(run.root) / "model.bin"
    original = copy.read_bytes()
    copy.write_bytes(original[:1000] + bytes([original[1000] ^ 1]) + original[1001:])
    try:
        assert main(["verify", str(run.root), str(ckpt), "--durable", run.uri]) == 1
    finally:
        copy.write_bytes(original)
    out = capsys.readouterr().out
    [failed] = [line for line in out.splitlines() if "FAILED" in line]
    assert failed.startswith(f"{ckpt}/model.bin") and "ChecksumError" in failed
    size = human_bytes(sum(map(len, files_under(ckpt).values())))
    assert out.rstrip().endswith(f"{ckpt}: NOT verified (5 files, {size})")

    broken = run.root / "dcp" / "broken"
    save_dcp(run.fs, broken, seed=2)
    try:
        assert main(["verify", str(run.root), "dcp/broken"]) == 0
        [shard] = broken.glob("*.distcp")
        with open(shard, "r+b") as f:
            f.truncate(shard.stat().st_size - 100)
        size = shard.stat().st_size
        assert main(["verify", str(run.root), "dcp/broken"]) == 1
        out = capsys.readouterr().out
    finally:
        run.fs.delete_dir(str(broken))
    assert f"FAILED: {shard.name} holds {size} bytes; .metadata names" in out
    assert "torch DCP metadata: checked" in out


def test_cp_copies_a_run_out_and_back_verified(
    cluster: Cluster, run: Run, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    backup = tmp_path / "backup"
    out = run_cli(
        cluster.address, "cp", f"node://{run.run}", f"file://{backup}", "--progress", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert files_under(backup) == files_under(run.run)  # byte for byte
    assert "100%" in out.stderr  # the bar, drawn on stderr
    back = air_transfer_json(
        cluster.address, "cp", str(backup), f"node://{run.root}/restored/cli-run"
    )
    assert back["verified"] and back["files"] == len(files_under(run.run))
    assert files_under(run.root / "restored" / "cli-run") == files_under(run.run)

    assert main(["cp", str(backup), f"node://{run.root}/restored/cli-run"]) == 1
    assert "exists; pass --overwrite" in capsys.readouterr().err
    assert main(["cp", str(backup), f"node://{run.root}/restored/cli-run", "--overwrite"]) == 0
    run.fs.delete_dir(str(run.root / "restored"))


def test_clean_removes_what_dead_writers_left(cluster: Cluster, run: Run) -> None:
    """A staging directory whose writer died (its lock file free), an upload file and
    a delete's trash, left in the run's directory: a dry run names them and removes
    nothing; ``clean`` then removes them (the upload once past ``--upload-age``), and
    every checkpoint is as it was."""
    staging = run.run / ".checkpoint_9.air-staging-1-aaaaaaaaaaaaaaaa"
    (staging / "optim").mkdir(parents=True)
    (staging / "optim" / "state.pt").write_bytes(b"s" * 1000)
    Path(f"{staging}.lock").touch()
    upload = run.checkpoints[0] / ".model.bin.air-upload-0123456789abcdef"
    upload.write_bytes(b"u" * 500)
    trash = run.run / ".checkpoint_8.air-trash-fedcba9876543210"
    trash.mkdir()
    (trash / "model.bin").write_bytes(b"t" * 300)
    before = files_under(run.root)

    dry = air_transfer_json(cluster.address, "clean", str(run.root), "--dry-run")
    actions = {Path(e["path"]).name: (e["kind"], e["bytes"], e["action"]) for e in dry["entries"]}
    assert actions[staging.name] == ("staging", 1000, "would remove")
    assert actions[f"{staging.name}.lock"] == ("staging-lock", 0, "would remove")
    assert actions[trash.name] == ("trash", 300, "would remove")
    assert actions[upload.name][:2] == ("upload", 500)
    assert actions[upload.name][2].startswith("kept: written to")
    assert staging.is_dir() and upload.exists() and trash.is_dir()

    done = air_transfer_json(cluster.address, "clean", str(run.root), "--upload-age", "0")
    assert {Path(e["path"]).name: e["action"] for e in done["entries"]} == {
        name: "removed" for name in actions
    }
    assert not staging.exists() and not upload.exists() and not trash.exists()
    assert not Path(f"{staging}.lock").exists()
    assert files_under(run.root) == before


def test_ls_and_verify_see_every_copy_of_replicated_storage(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Node storage kept on 2 nodes: ``ls`` says so, ``verify`` reads the checkpoint
    from each copy on its own and fails, naming the copy, once one differs."""
    root = tmp_path / "primary"
    root.mkdir()
    fs = air_transfer.storage_filesystem(
        root=str(root), replicas=2, replica_root=str(tmp_path / "copy-{node_id}")
    )
    ckpt = f"{root}/exp/checkpoint_000000"
    fs.create_dir(ckpt)
    for name, size in (("model.bin", SIZE), ("empty", 0)):
        with fs.open_output_stream(f"{ckpt}/{name}") as f:
            f.write(bytes(range(256)) * (size // 256) + b"x" * (size % 256))
    assert main(["ls", str(root), "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["checkpoints"]
    assert (listed["path"], listed["copies"], listed["tier"]) == (ckpt, 2, "replicated")
    assert main(["verify", str(root), ckpt, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert {(f["copies_read"], f["ok"]) for f in report["files"]} == {(2, True)}

    [other] = [p for p in tmp_path.glob("copy-*") if p.is_dir()]
    copy = other / "exp" / "checkpoint_000000" / "model.bin"
    data = copy.read_bytes()
    copy.write_bytes(data[:-1] + b"y")  # altered at rest on one copy
    try:
        assert main(["verify", str(root), ckpt, "--json"]) == 1
    finally:
        copy.write_bytes(data)
    report = json.loads(capsys.readouterr().out)
    [bad] = [f for f in report["files"] if not f["ok"]]
    assert bad["path"] == f"{ckpt}/model.bin"
    assert bad["problems"] == [
        f"the copy on node {other.name[5:17]} differs from the first copy read"
    ]
