"""`accord contracts`: print the op contract reference (Markdown)."""

from __future__ import annotations

import argparse

from ...op_contracts import CONTRACTS
from ...op_contracts.render import render_reference


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "contracts",
        help="print the op contract reference",
        description="Print every op contract (arguments, dtypes, shapes, rules, tolerances) as Markdown.",
    )
    parser.add_argument("--op", action="append", help="only this op (repeatable)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = args.op or list(CONTRACTS)
    unknown = [n for n in names if n not in CONTRACTS]
    if unknown:
        print(f"unknown op(s): {', '.join(unknown)}; known: {', '.join(CONTRACTS)}")
        return 2
    print(render_reference(CONTRACTS[n] for n in names), end="")
    return 0
