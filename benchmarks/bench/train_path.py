"""``bench --train``: the Ray Train path, report and restore through
``storage_filesystem``, beside what bounds it, in one run.

A 2-node mock cluster (``--cross-node``'s): the head is the storage node (and the
driver's), the other node has no storage. Each repeat, at every size:

- ``cp-direct`` on the storage node and ``raw`` across the nodes (numpy put on one,
  get on the other), the floors, exactly as the contenders of the same names;
- three short Train runs (``DataParallelTrainer``, one worker, one report per size
  after an untimed warm-up), each timing ``ray.train.report(checkpoint=...)`` inside
  the worker: through ``storage_filesystem`` with the worker on the other node
  (``report/other-node``) and on the storage node (``report/storage-node``), and
  with a plain local ``storage_path`` on the storage node (``report/local-fs``:
  what Train itself costs);
- restores of what those runs stored: ``checkpoint.to_directory()`` of the node
  storage checkpoint in the driver (``restore/storage-node``) and in an actor on the
  other node (``restore/other-node``), and of the local-filesystem one in the driver
  (``restore/local-fs``).

Every stored checkpoint and every restored directory is compared byte for byte
with the source; stored checkpoints are deleted once restored. Ratios: to
``cp-direct`` (the bar on the storage node) and to ``raw`` (the bar across nodes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from collections.abc import Iterator
from typing import Any

import psutil
import ray
import ray.train
from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

from air_transfer import storage_filesystem
from benchmarks.bench.contenders import RAW, Trip
from benchmarks.bench.data import GB, first_difference, timed_restore, tree_digest
from benchmarks.bench.endpoint import WARM_STORE_FRACTION, Ends, fill_store
from benchmarks.bench.measure import Measurement, error_reason, measure_once, skip_reason
from benchmarks.bench.report import add_ratios, run_config, skipped, summarize
from benchmarks.bench.runner import Setup, prepare, progress, start_pair
from benchmarks.bench.sampler import object_store_used, wait_for_store_at_most
from benchmarks.bench.session import CROSS_NODES, machine_info, ray_session, store_capacity

CP_DIRECT = "cp-direct"
REPORT_OTHER = "report/other-node"
REPORT_STORAGE = "report/storage-node"
REPORT_LOCAL = "report/local-fs"
RESTORE_STORAGE = "restore/storage-node"
RESTORE_OTHER = "restore/other-node"
RESTORE_LOCAL = "restore/local-fs"
#: Row order of the table, and the floor each Train row is held against: the disk
#: where the bytes stay on the storage node, Ray's own transfer where they cross.
ROWS = {
    CP_DIRECT: None,
    RAW: None,
    REPORT_OTHER: RAW,
    REPORT_STORAGE: CP_DIRECT,
    REPORT_LOCAL: CP_DIRECT,
    RESTORE_OTHER: RAW,
    RESTORE_STORAGE: CP_DIRECT,
    RESTORE_LOCAL: CP_DIRECT,
}
TRAIN_METRICS = {
    "seconds": "report/*: ray.train.report(checkpoint=...) blocking time inside the "
    "training worker; restore/*: checkpoint.to_directory() in the driver (storage node) "
    "or in an actor on the other node; cp-direct, raw: as the contenders",
    "floor": "what the row is held against: cp-direct on the storage node, raw across",
    "ratio_to_floor": "median / the floor's median at the same size",
    "size_gb": "decimal GB (10**9 bytes)",
}


#: Untimed reports a fresh training worker makes first: the first two reports of a
#: run took 0.24 and 0.06 s more than the later ones at 4 MB (0.009 s).
WARMUP_REPORTS = 2


def step_pause_s() -> float:
    """How long the training worker pauses before each timed report, as a training
    step would: Ray Train's worker hands each report to a queue of one
    (``worker_group/worker.py``, ``queue.Queue(maxsize=1)``) that the controller
    empties when it polls, every ``RAY_TRAIN_HEALTH_CHECK_INTERVAL_S`` (2 s), so a
    report made right after another waits up to 2 s for that poll (measured: 4 MB
    reports back to back took 2.0 s each, on a local filesystem too)."""
    return float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2")) + 0.5


def report_loop(config: dict[str, Any]) -> None:
    """The training worker: an untimed warm-up (most of the object store mapped
    into this fresh process, ``WARMUP_REPORTS`` small reports), then one timed
    report per source after a pause (``step_pause_s``), each time recorded in
    ``config["log"]``."""
    if config["warm"]:
        before = object_store_used()
        refs = fill_store(WARM_STORE_FRACTION)
        del refs
        wait_for_store_at_most(before + 64 * 1024 * 1024, timeout_s=10.0)
    for _ in range(WARMUP_REPORTS if config["warmup_source"] else 0):
        time.sleep(step_pause_s())
        checkpoint = ray.train.Checkpoint.from_directory(config["warmup_source"])
        ray.train.report({"source": "warmup"}, checkpoint=checkpoint)
    for key, path in config["sources"]:
        time.sleep(step_pause_s())
        os.sync()  # the previous report's writes are not flushed on this one's clock
        checkpoint = ray.train.Checkpoint.from_directory(path)
        start = time.perf_counter()
        ray.train.report(
            {"source": key}, checkpoint=checkpoint, delete_local_checkpoint_after_upload=False
        )
        seconds = time.perf_counter() - start
        ray.get(config["log"].add.remote(key, seconds))


class ReportLog:
    """Where the training worker records each report's blocking time."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, key: str, seconds: float) -> None:
        self.seconds[key] = seconds

    def get(self) -> dict[str, float]:
        return self.seconds


def source_key(layout: str, nbytes: int) -> str:
    """How a source checkpoint is named in the reports' metrics."""
    return f"{layout}-{nbytes}"


class TrainBench:
    """One ``--train`` run: its cluster's roles, its measurements so far, and the
    methods that add to them."""

    def __init__(self, opts: argparse.Namespace, setup: Setup, ends: Ends) -> None:
        self.opts, self.setup, self.ends = opts, setup, ends
        self.storage_dir = os.path.join(opts.data_dir, "train-storage")
        os.makedirs(self.storage_dir, exist_ok=True)
        self.runs: dict[tuple[str, str, int], list[Measurement]] = {}
        self.skips: dict[tuple[str, str, int], str] = {}

    def clear_storage(self) -> None:
        """Delete what the last Train run stored (the disk holds one run at a time),
        on every copy alike (``--replicas``: each copy's root stays, emptied)."""
        shutil.rmtree(self.storage_dir, ignore_errors=True)
        os.makedirs(self.storage_dir, exist_ok=True)
        for root in self.replica_roots():
            shutil.rmtree(root, ignore_errors=True)
            os.makedirs(root, exist_ok=True)

    def replica_roots(self) -> list[str]:
        copies = self.storage_dir + "-copies"
        return (
            [os.path.join(copies, n) for n in os.listdir(copies)] if os.path.isdir(copies) else []
        )

    def storage(self, node: str) -> Any:
        """The run's node storage on ``node``, with ``--replicas`` copies (the others
        under ``train-storage-copies/<node id>``: the mock nodes share this disk)."""
        if self.opts.replicas == 1:
            return storage_filesystem(node=node, config=self.setup.config, root=self.storage_dir)
        return storage_filesystem(
            node=node,
            config=self.setup.config,
            root=self.storage_dir,
            replicas=self.opts.replicas,
            replica_root=self.storage_dir + "-copies/{node_id}",
        )

    def keys(self) -> Iterator[tuple[str, int]]:
        for layout, sizes in self.setup.plan.items():
            for _, nbytes in sizes:
                yield layout, nbytes

    def record(self, row: str, layout: str, nbytes: int, m: Measurement) -> None:
        self.runs.setdefault((row, layout, nbytes), []).append(m)
        what = f"{row} {layout} {nbytes / GB:g} GB"
        if m.error:
            progress(f"  {what}: FAILED: {m.error}")
        elif m.trip is not None:
            progress(f"  {what}: {m.trip.seconds:.3f} s, verified")

    def floors(self) -> None:
        """``cp-direct`` and ``raw`` at every size, as the contenders measure them."""
        margin = int(self.opts.memory_margin_gb * GB)
        for layout, nbytes in self.keys():
            src, source = self.setup.sources[layout, nbytes]
            for name in (CP_DIRECT, RAW):
                available = psutil.virtual_memory().available
                config = self.setup.config
                reason = skip_reason(name, nbytes, config, available, margin, store_capacity())
                if reason:
                    self.skips[name, layout, nbytes] = reason
                    progress(f"  {name} {layout} {nbytes / GB:g} GB: skipped: {reason}")
                    continue
                out = os.path.join(self.opts.data_dir, "out", f"train-{name}-{nbytes}")
                m = measure_once(name, self.ends, src, out, nbytes, source, self.opts)
                self.record(name, layout, nbytes, m)

    def train_run(
        self, row: str, worker_node: str, fs: Any, rep: int
    ) -> dict[str, ray.train.Checkpoint]:
        """One Train run with the worker on ``worker_node``, reporting every source
        once to ``fs`` (None: local storage); records the report times and checks
        what landed. Returns the stored checkpoints by source key."""
        log: Any = ray.remote(num_cpus=0)(ReportLog).remote()
        sources = [
            (source_key(layout, nbytes), self.setup.sources[layout, nbytes][0])
            for layout, nbytes in self.keys()
        ]
        warmup = self.setup.sources.get("warmup")
        trainer = DataParallelTrainer(
            report_loop,
            train_loop_config={
                "sources": sources,
                "log": log,
                "warm": self.opts.warmup,
                "warmup_source": warmup[0] if warmup else None,
            },
            scaling_config=ray.train.ScalingConfig(
                num_workers=1, resources_per_worker={"CPU": 1, worker_node: 0.01}
            ),
            run_config=ray.train.RunConfig(
                name=f"{row.replace('/', '-')}-{rep}",
                storage_path=self.storage_dir,
                storage_filesystem=fs,
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=None),
            ),
        )
        try:
            result = trainer.fit()
            seconds: dict[str, float] = ray.get(log.get.remote())
        except Exception as e:
            for layout, nbytes in self.keys():
                self.record(
                    row, layout, nbytes, Measurement(None, error_reason(e, False, 0), {}, 0)
                )
            return {}
        finally:
            ray.kill(log)
        stored = {m["source"]: c for c, m in result.best_checkpoints or [] if "source" in m}
        for layout, nbytes in self.keys():
            key = source_key(layout, nbytes)
            checkpoint = stored.get(key)
            if key not in seconds or checkpoint is None:
                m = Measurement(None, f"the run reported no checkpoint for {key}", {}, 0)
            else:
                # The storage node is this machine: what landed is read directly.
                m = self._verified(Trip(seconds[key]), layout, nbytes, tree_digest(checkpoint.path))
            self.record(row, layout, nbytes, m)
        return stored

    def restores(self, row: str, stored: dict[str, ray.train.Checkpoint], here: bool) -> None:
        """``to_directory`` of every stored checkpoint: in the driver (the storage
        node) if ``here``, else in the consumer actor on the other node."""
        for layout, nbytes in self.keys():
            checkpoint = stored.get(source_key(layout, nbytes))
            if checkpoint is None:
                continue  # its report failed, and says so
            out = os.path.join(self.opts.data_dir, "out", f"{row.replace('/', '-')}-{nbytes}")
            os.sync()
            try:
                if here:
                    seconds, digest = timed_restore(checkpoint, out)
                else:
                    seconds, digest = ray.get(self.ends.consumer.restore.remote(checkpoint, out))
                m = self._verified(Trip(seconds), layout, nbytes, digest)
            except Exception as e:
                m = Measurement(None, error_reason(e, False, 0), {}, 0)
            self.record(row, layout, nbytes, m)

    def _verified(self, trip: Trip, layout: str, nbytes: int, digest: Any) -> Measurement:
        difference = first_difference(self.setup.sources[layout, nbytes][1], digest)
        trip.verified = difference is None
        error = None if difference is None else f"output differs from the source: {difference}"
        return Measurement(trip if difference is None else None, error, {}, 0)

    def rows(self) -> list[dict[str, Any]]:
        out = []
        for layout, sizes in self.setup.plan.items():
            for size_gb, nbytes in sizes:
                for row, floor in ROWS.items():
                    runs = self.runs.get((row, layout, nbytes), [])
                    reason = self.skips.get((row, layout, nbytes))
                    if reason and not runs:
                        row_ = skipped(row, layout, size_gb, nbytes, reason)
                    else:
                        row_ = summarize(row, layout, size_gb, nbytes, runs)
                    out.append({**row_, "floor": floor})
        add_ratios(out, {"cp_direct": CP_DIRECT, "raw": RAW})
        for r in out:
            floor = r.get("floor")
            r["ratio_to_floor"] = r.get(f"ratio_to_{floor.replace('-', '_')}") if floor else None
        return out


def run_train(opts: argparse.Namespace) -> dict[str, Any]:
    """The ``--train`` run (see the module docstring); returns the JSON report."""
    setup = prepare(opts, len(CROSS_NODES))
    storage_resource, other_resource = CROSS_NODES
    with ray_session(True, opts.num_cpus, setup.store_bytes) as how:
        progress(f"{how}: the storage node is the driver's ({storage_resource}), the "
                 f"other is {other_resource}; {opts.repeats} repeats")  # fmt: skip
        storage = str(ray.get_runtime_context().get_node_id())
        ends = start_pair(RAW, setup.config, setup.sources.get("warmup"), opts)
        bench = TrainBench(opts, setup, ends)
        fs = bench.storage(storage)
        try:
            for rep in range(1, opts.repeats + 1):
                progress(f"repeat {rep}/{opts.repeats}: {CP_DIRECT} and {RAW}")
                bench.floors()
                stored = bench.train_run(REPORT_OTHER, other_resource, fs, rep)
                bench.restores(RESTORE_STORAGE, stored, here=True)
                bench.restores(RESTORE_OTHER, stored, here=False)
                bench.clear_storage()
                bench.train_run(REPORT_STORAGE, storage_resource, fs, rep)
                bench.clear_storage()
                stored = bench.train_run(REPORT_LOCAL, storage_resource, None, rep)
                bench.restores(RESTORE_LOCAL, stored, here=True)
                bench.clear_storage()
        finally:
            ends.kill()
            shutil.rmtree(bench.storage_dir, ignore_errors=True)
            shutil.rmtree(bench.storage_dir + "-copies", ignore_errors=True)
        store = ray.cluster_resources().get("object_store_memory", 0) / len(CROSS_NODES)
    return {
        "mode": "train",
        "config": run_config(opts, setup.config, list(ROWS), store, TRAIN_METRICS),
        "machine": machine_info(opts.data_dir),
        "results": bench.rows(),
    }
