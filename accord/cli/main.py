"""`accord`: the command line. Each subcommand lives in its own module under
`accord.cli.commands` (bench: `accord.bench.cli`, the benchmark package's own) and adds
its parser here."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from .. import __version__

#: Subcommand modules; each defines `add_parser(subparsers)` that sets `func`.
COMMAND_MODULES = tuple(f"accord.cli.commands.{name}" for name in ("serve", "backends", "contracts", "conformance", "eval")) + (
    "accord.bench.cli", "accord.router.cli",
)


def build_parser() -> argparse.ArgumentParser:
    """The full parser, every subcommand included (so `accord --help` is complete)."""
    parser = argparse.ArgumentParser(
        prog="accord",
        description="accord: one OpenAI-compatible LLM serving engine for NVIDIA, AMD, Ascend and CPUs.",
    )
    parser.add_argument("--version", action="version", version=f"accord {__version__}")
    parser.add_argument("--log-level", default="WARNING", help="logging level (default: WARNING)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as error:
            if error.name == name:
                continue  # a command not written yet
            raise
        module.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `accord` script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
