"""The ``air-transfer`` command: argument parsing and each command's output. Parsing
imports nothing that connects anywhere; a command joins the running Ray cluster when
it runs (``session.connect``).

Exit status: 0 when the command did what it says (``verify``: every check passed), 1
when it failed (the error on stderr, naming the path), 2 for a command line it cannot
parse.
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback
from collections.abc import Callable, Sequence

from air_transfer.cli.address import NODE_FORMS, parse_location, parse_node_path
from air_transfer.cli.connect import HANDSHAKE_TIMEOUT_S
from air_transfer.cli.output import emit_json, human_bytes, redact
from air_transfer.core.environ import package_version

#: What a command reports as an error of the user's or of the storage (not a bug).
ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    ValueError,
    TypeError,
    ConnectionError,
    TimeoutError,
)

DESCRIPTION = """\
Checkpoints kept by air-transfer's node storage: list them, verify them, copy them to
and from any pyarrow or fsspec URI, and remove what dead writers left behind. Node
storage is written node://NODE/PATH (NODE: head, a node id or an IP address; empty,
node:///PATH, for --node) or, where only node storage makes sense, as a plain
absolute path on --node. Each command joins the running Ray cluster (--address).
"""


def build_parser() -> argparse.ArgumentParser:
    """The command line (``air-transfer --help``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--address",
        default="auto",
        help="the Ray cluster to join (default: auto, the one this machine is part of; "
        "RAY_ADDRESS works too)",
    )
    common.add_argument(
        "--connect-timeout",
        type=_seconds,
        default=HANDSHAKE_TIMEOUT_S,
        metavar="SECONDS",
        help="how long the cluster may take to answer before the command fails "
        "(default: %(default)s)",
    )
    common.add_argument(
        "--node",
        default=None,
        help=f"the storage node of plain paths and of node:///PATH: {NODE_FORMS} "
        "(default: head, where a `ray job submit` driver keeps a run's storage)",
    )
    common.add_argument("--json", action="store_true", help="print JSON for scripts")
    shows = argparse.ArgumentParser(add_help=False)
    bars = shows.add_mutually_exclusive_group()
    bars.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="always draw a progress bar on stderr (default: when stderr is a "
        "terminal, or as AIR_TRANSFER_PROGRESS says, for work past a second)",
    )
    bars.add_argument("--no-progress", dest="progress", action="store_false")
    durable = argparse.ArgumentParser(add_help=False)
    durable.add_argument(
        "--durable",
        metavar="URI",
        help="the durable tier the run's storage drains into (its "
        "storage_filesystem(durable=...)); ROOT must then be that storage's root",
    )

    parser = argparse.ArgumentParser(
        prog="air-transfer",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    ls = sub.add_parser(
        "ls",
        parents=[common, durable],
        help="list the checkpoints under ROOT: size, age, kind, where kept",
        description="List the checkpoints under ROOT (directories named checkpoint_*, "
        "and directories holding a torch DCP .metadata) with their size, age and state: "
        "local, on K copies, durable.",
    )
    ls.add_argument("root", metavar="ROOT", help="a directory of node storage (a run's, or "
                    "the storage root holding several runs)")  # fmt: skip
    ls.set_defaults(run=_ls)

    verify = sub.add_parser(
        "verify",
        parents=[common, durable, shows],
        help="read every file of one checkpoint back and check it",
        description="Read every file of the checkpoint PATH back from node storage (each "
        "fresh copy), check every chunk on the way, compare copies, the durable tier's "
        "records (--durable) and a DCP checkpoint's metadata. Exit status 1 if any "
        "check fails.",
    )
    verify.add_argument("root", metavar="ROOT", help="the storage root (as for ls)")
    verify.add_argument(
        "path", metavar="PATH", help="the checkpoint: relative to ROOT, or absolute"
    )
    verify.set_defaults(run=_verify)

    cp = sub.add_parser(
        "cp",
        parents=[common, shows],
        help="copy a checkpoint or a run between node storage and any URI, verified",
        description="Copy SRC to DST (DST becomes the copy of SRC) and read every file "
        "back to compare. Either side is node storage (node://NODE/PATH), a pyarrow or "
        "fsspec URI (s3://, gs://, hdfs://, file://, ...), or a path on this machine.",
    )
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dst", metavar="DST")
    cp.add_argument(
        "--overwrite",
        action="store_true",
        help="DST may exist: the files the copy brings replace it, nothing else is touched",
    )
    cp.set_defaults(run=_cp)

    clean = sub.add_parser(
        "clean",
        parents=[common],
        help="remove what dead writers left under ROOT (staging, uploads, trash, locks)",
        description="Remove the hidden entries under ROOT that air-transfer's writers "
        "left when they died: staging directories and locks (only where the writer's "
        "lock proves it dead), the trash of interrupted deletes, and upload files left "
        "untouched for --upload-age seconds; for the root of a writer-placed storage, "
        "the blobs on its holder nodes that no stub names and whose writer is proven "
        "dead. Nothing a live writer holds.",
    )
    clean.add_argument("root", metavar="ROOT", help="a directory of node storage")
    clean.add_argument("--dry-run", action="store_true", help="remove nothing; say what would go")
    clean.add_argument(
        "--upload-age",
        type=_seconds,
        default=3600.0,
        metavar="SECONDS",
        help="an upload file untouched this long is abandoned (default: 3600)",
    )
    clean.set_defaults(run=_clean)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` (default: ``sys.argv[1:]``); its exit status."""
    args = build_parser().parse_args(argv)
    run: Callable[[argparse.Namespace], int] = args.run
    try:
        return run(args)
    except ERRORS as e:
        print(redact(f"air-transfer {args.command}: error: {_message(e)}"), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"air-transfer {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # a defect: its traceback, with any URI's secret hidden
        print(redact("".join(traceback.format_exception(e))), file=sys.stderr)
        return 1


def _print(text: str) -> None:
    print(redact(text))


def _ls(args: argparse.Namespace) -> int:
    top = parse_node_path(args.root)
    from air_transfer.cli import listing, session

    session.connect(args.address, args.connect_timeout)
    storage = session.open_storage(top, args.node, args.durable)
    records = listing.list_checkpoints(storage, top.path)
    if args.json:
        emit_json({"root": top.path, "node": storage.node, "checkpoints": records})
    elif records:
        _print(listing.render(records))
    else:
        _print(f"no checkpoints under {top.path}")
    return 0


def _verify(args: argparse.Namespace) -> int:
    top = parse_node_path(args.root)
    path = args.path if args.path.startswith("/") else f"{top.path}/{args.path}"
    target = parse_node_path(path).path
    from air_transfer.cli import session, verify

    session.connect(args.address, args.connect_timeout)
    storage = session.open_storage(top, args.node, args.durable)
    with _bar(args, f"verify {target}", verify.total_bytes(storage, target)) as advance:
        report = verify.verify(storage, target, advance)
    if args.json:
        emit_json(report.to_dict())
    else:
        _print(verify.render(report))
    return 0 if report.ok else 1


def _cp(args: argparse.Namespace) -> int:
    src, dst = parse_location(args.src), parse_location(args.dst)
    from air_transfer.cli import copy, session
    from air_transfer.cli.address import NodePath

    sides = []
    for where in (src, dst):
        if isinstance(where, NodePath):
            session.connect(args.address, args.connect_timeout)
            # Any path the user names, as cp reaches it: the whole disk, asked for.
            storage = session.open_storage(where, args.node, root="/", expose_system_dirs=True)
            sides.append((storage.filesystem, where.path))
        else:
            sides.append(session.open_other(where))
    (src_fs, src_path), (dst_fs, dst_path) = sides
    if not isinstance(src, NodePath):  # out of a durable tier: by its manifests, decoded
        src_fs = session.through_tier(src_fs, src_path)
    tree = copy.plan(src_fs, src_path, dst_fs, dst_path, args.overwrite, str(dst))
    with _bar(args, f"cp {src}", tree.nbytes) as copied:
        sums = copy.copy_between(src_fs, src_path, dst_fs, dst_path, tree, copied)
    with _bar(args, f"verify {dst}", tree.nbytes) as checked:
        done = copy.check_copy(dst_fs, dst_path, sums, str(src), checked)
    if args.json:
        emit_json(done.to_dict())
    else:
        size = human_bytes(done.nbytes)
        _print(f"copied {args.src} to {args.dst}: {done.files} files, {size}, verified")
    return 0


def _clean(args: argparse.Namespace) -> int:
    top = parse_node_path(args.root)
    from air_transfer.cli import clean, session

    session.connect(args.address, args.connect_timeout)
    storage = session.open_storage(top, args.node)
    records = clean.clean(storage, top.path, args.dry_run, args.upload_age)
    if args.json:
        emit_json({"root": top.path, "dry_run": args.dry_run, "entries": records})
    else:
        _print(clean.render(records, args.dry_run))
    return 0 if not any(r["action"].startswith("failed") for r in records) else 1


class _NoBar:
    def __enter__(self) -> Callable[[int], None]:
        return lambda _n: None

    def __exit__(self, *_: object) -> None:
        return None


class _ByteBar:
    """A bar of bytes on stderr, shared by the threads of a command."""

    def __init__(self, desc: str, total: int, delay: float) -> None:
        from air_transfer.cli.copy import Counter
        from air_transfer.observe.progress import Bar

        self._bar = Bar(redact(desc), total, delay)
        self.advance = Counter(self._bar.update)

    def __enter__(self) -> Callable[[int], None]:
        return self.advance

    def __exit__(self, *_: object) -> None:
        self._bar.close()


def _bar(args: argparse.Namespace, desc: str, total: int) -> _NoBar | _ByteBar:
    """A progress bar for ``total`` bytes: drawn at once with ``--progress``, after a
    second where bars are on by default (a terminal, ``AIR_TRANSFER_PROGRESS``)."""
    from air_transfer.observe.progress import progress_enabled

    if args.progress is False or (args.progress is None and not progress_enabled(None)):
        return _NoBar()
    return _ByteBar(desc, total, 0.0 if args.progress else 1.0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a number of seconds, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"a finite number of seconds >= 0, got {text!r}")
    return value


def _message(error: BaseException) -> str:
    text = str(error)
    filename = getattr(error, "filename", None)
    if filename and str(filename) not in text:
        text = f"{filename}: {text}"
    return f"{text} ({type(error).__name__})"
