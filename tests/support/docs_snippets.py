"""What the documentation's code blocks leave to the reader, made concrete for the docs
harness (``tests.support.docs_blocks`` says how a block names them). Each is Python
source, run in the block's namespace before it (``with=``) or after it (``then=``),
or around it (``inside=``: the block at ``{block}``); paths under ``/mnt/`` live in
the test's temporary directory, as the block's do. Small on purpose: each Train run
has two workers and a few kilobytes."""

from __future__ import annotations

#: A training loop that reports a small checkpoint at each of two steps.
TRAIN_LOOP = """
import os as _os, tempfile as _tempfile
import ray.train as _train

def train_loop_per_worker(config=None):
    for step in range(2):
        with _tempfile.TemporaryDirectory() as where:
            rank = _train.get_context().get_world_rank()
            with open(_os.path.join(where, f"model-{rank}.bin"), "wb") as f:
                f.write(bytes(1000))
            _train.report({"step": step + 1}, checkpoint=_train.Checkpoint.from_directory(where))
"""

#: After a block that ran ``result = trainer.fit()``: it kept a checkpoint.
RESULT_HAS_CHECKPOINT = """
assert result.error is None, result.error
assert result.checkpoint is not None and result.metrics["step"] == 2, result
"""

#: A Train worker's loop around the block, with what a report uses: ``metrics``, a
#: ``local_dir`` holding a model, ``checkpoint`` of it; run on node storage.
IN_TRAIN_WORKER = """
import os as _os, tempfile as _tempfile
import ray, ray.train
import ray.train as _train
from ray.train.torch import TorchTrainer as _TorchTrainer
import air_transfer

def _loop(config):
    metrics = {"loss": 0.5}
    local_dir = _tempfile.mkdtemp()
    with open(_os.path.join(local_dir, "model.bin"), "wb") as f:
        f.write(bytes(4096))
    checkpoint = _train.Checkpoint.from_directory(local_dir)
    {block}

_result = _TorchTrainer(
    _loop,
    scaling_config=_train.ScalingConfig(num_workers=2),
    run_config=_train.RunConfig(
        storage_path=STORAGE_PATH, storage_filesystem=STORAGE_FILESYSTEM
    ),
).fit()
assert _result.error is None, _result.error
with _result.checkpoint.as_directory() as _where:
    assert open(_os.path.join(_where, "model.bin"), "rb").read() == bytes(4096)
"""

#: Node storage for ``IN_TRAIN_WORKER``.
ON_NODE_STORAGE = """
import air_transfer
STORAGE_PATH = "/mnt/checkpoints"
STORAGE_FILESYSTEM = air_transfer.storage_filesystem(root=STORAGE_PATH)
"""

#: Storage that is not node storage (a bucket, NFS: here a local directory).
ON_OTHER_STORAGE = """
import os as _os
STORAGE_PATH = "/mnt/shared-storage"
_os.makedirs(STORAGE_PATH, exist_ok=True)
STORAGE_FILESYSTEM = None
"""

#: A model and one step of training, for the torch DCP loop.
DCP_MODEL = """
import torch as _torch
from ray.train.torch import prepare_model as _prepare_model

def build():
    model = _prepare_model(_torch.nn.Linear(8, 1))
    return model, _torch.optim.Adam(model.parameters())

def train_one_step(model, optimizer):
    loss = model(_torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()
"""

#: The torch DCP loop run for two steps: two DCP checkpoints (the resume is
#: tests/e2e/test_dcp_train.py's).
FIT_DCP_LOOP = """
import ray.train as _train
from ray.train.torch import TorchTrainer as _TorchTrainer
import air_transfer

def _fit(steps):
    return _TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"steps": steps},
        scaling_config=_train.ScalingConfig(num_workers=2),
        run_config=_train.RunConfig(
            name="dcp-guide",
            storage_path="/mnt/checkpoints",
            storage_filesystem=air_transfer.storage_filesystem(root="/mnt/checkpoints"),
        ),
    ).fit()

_result = _fit(2)
assert _result.error is None and _result.metrics["step"] == 2, (_result.error, _result.metrics)
_fs = air_transfer.storage_filesystem(root="/mnt/checkpoints")
_saved = air_transfer.list_checkpoints(_fs, "/mnt/checkpoints/dcp-guide")
assert [c.dcp for c in _saved] == [True] * 2, _saved
"""

#: A state dict to save and load outside Train.
STATE_DICT = """
import torch as _torch
state_dict = {"weight": _torch.arange(16.0), "step": _torch.tensor(100)}
"""

#: What the transfers guide's loop leaves to the reader.
EPOCHS = """
import os as _os

epochs = 2

def train_one_epoch(epoch):
    path = f"/mnt/checkpoints/epoch_{epoch}"
    _os.makedirs(path, exist_ok=True)
    with open(_os.path.join(path, "model.bin"), "wb") as f:
        f.write(bytes([epoch]) * 100_000)
    return path

def score(path):
    return len(open(_os.path.join(path, "model.bin"), "rb").read())
"""

#: A checkpoint directory on this node, for a transfer.
EPOCH_3 = """
import os as _os
_os.makedirs("/mnt/checkpoints/epoch_3", exist_ok=True)
with open("/mnt/checkpoints/epoch_3/model.bin", "wb") as _f:
    _f.write(bytes(300_000))
"""

#: A run in node storage for the command line's examples, and ``$CKPT``.
CLI_RUN = """
import air_transfer
_fs = air_transfer.storage_filesystem(root="/mnt/checkpoints")
CKPT = "my-run/checkpoint_2026-12-05_10-21-07.482913"
_fs.create_dir(f"/mnt/checkpoints/{CKPT}")
for _name, _size in (("model.bin", 200_000), ("optim.bin", 1000)):
    with _fs.open_output_stream(f"/mnt/checkpoints/{CKPT}/{_name}") as _f:
        _f.write(bytes(_size))
DOCS_ENV = {"CKPT": CKPT}
"""

#: After ``ray job submit`` of the deploy page's ``train.py``: the job succeeded, and
#: its two checkpoints are where the page says: in node storage under ``root`` on the
#: head node (this process's node: its agent drained them), in the run's directory,
#: and in the durable tier at the same path.
DEPLOYED_RUN = """
import re as _re
import pyarrow.fs as _pafs
import air_transfer
assert _re.search(r"Job 'raysubmit_\\w+' succeeded", DOCS_STDOUT), DOCS_STDOUT[-2000:]
_fs = air_transfer.storage_filesystem(root="/mnt/checkpoints")
_kept = air_transfer.list_checkpoints(_fs, "/mnt/checkpoints/my-run")
assert [(_c.run, _c.files, _c.tier) for _c in _kept] == [("", 2, "durable")] * 2, _kept
_bucket, _runs = _pafs.FileSystem.from_uri("s3://my-bucket/runs")
for _c in _kept:
    _where = _runs + "/" + _c.path.removeprefix("/mnt/checkpoints/")
    _files = _bucket.get_file_info(_pafs.FileSelector(_where))
    assert sorted(_f.base_name for _f in _files) == ["model-0.bin", "model-1.bin"], _files
"""

#: Every node's agent of the cluster, started (the first use of a node starts it).
NODE_AGENTS = """
import ray as _ray
import air_transfer
for _node in _ray.nodes():
    if _node["Alive"]:
        _ray.get(air_transfer.node_agent(_node["NodeID"]).read_counters.remote())
"""

#: After ``ray list actors --filter "class_name=NodeAgent"``: each live node's agent
#: is listed alive, on its node, and no other one alive (an agent that
#: ``shutdown_agents()`` ended is listed dead).
NODE_AGENTS_LISTED = """
import ray as _ray
_lines = [_l.split() for _l in DOCS_STDOUT.splitlines()]
_head = next((_l for _l in _lines if _l[:1] == ["ACTOR_ID"]), [])  # none: no row
_rows = [dict(zip(_head, _l[1:])) for _l in _lines if "NodeAgent" in _l]
_alive = {(_r["NAME"], _r["NODE_ID"]) for _r in _rows if _r["STATE"] == "ALIVE"}
_nodes = [_n["NodeID"] for _n in _ray.nodes() if _n["Alive"]]
assert len(_nodes) == 3, _nodes
assert _alive == {(f"air-transfer-agent-{_n}", _n) for _n in _nodes}, DOCS_STDOUT
"""

SNIPPETS = {
    "train_loop_per_worker": TRAIN_LOOP,
    "train_loop": TRAIN_LOOP + "train_loop = train_loop_per_worker\n",  # durable.md's name
    "result_has_checkpoint": RESULT_HAS_CHECKPOINT,
    "in_train_worker": IN_TRAIN_WORKER,
    "on_node_storage": ON_NODE_STORAGE,
    "on_other_storage": ON_OTHER_STORAGE,
    "dcp_model": DCP_MODEL,
    "fit_dcp_loop": FIT_DCP_LOOP,
    "state_dict": STATE_DICT,
    "epochs": EPOCHS,
    "epoch_3": EPOCH_3,
    "cli_run": CLI_RUN,
    "deployed_run": DEPLOYED_RUN,
    "node_agents": NODE_AGENTS,
    "node_agents_listed": NODE_AGENTS_LISTED,
}
