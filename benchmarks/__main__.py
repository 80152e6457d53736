"""``python -m benchmarks COMMAND``: the project's tools, outside the library.

``bench`` runs the transfer contenders side by side (``benchmarks.bench``); ``demo``
runs Ray Train on a two-node mock cluster with checkpoints stored on the driver node
(``benchmarks.demo``). Each subcommand adds its flags with ``add_arguments`` and sets
``run``. Run from the repository root (the tools are not part of the installed wheel).
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per command."""
    from benchmarks import bench, demo

    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="air-transfer: move large Ray Train checkpoints through the Ray "
        "object store in chunks.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench_parser = commands.add_parser(
        "bench",
        help="measure checkpoint transfer contenders side by side",
        description=bench.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    bench.add_arguments(bench_parser)
    demo_parser = commands.add_parser(
        "demo",
        help="Ray Train across two nodes with checkpoints stored on the driver node",
        description=demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    demo.add_arguments(demo_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments) and run the command."""
    opts = build_parser().parse_args(argv)
    status: int = opts.run(opts)
    return status


if __name__ == "__main__":
    sys.exit(main())
