"""`accord contracts`: print the op contract reference (Markdown), or with `--stub` the
typed `Ops` module editors and type checkers read."""

from __future__ import annotations

import argparse

from ...op_contracts import CONTRACTS
from ...op_contracts.render import render_reference
from ...op_contracts.stub import STUB_PATH, render_ops_stub


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "contracts",
        help="print the op contract reference",
        description="Print every op contract (arguments, dtypes, shapes, rules, tolerances) as Markdown.",
    )
    parser.add_argument("--op", action="append", help="only this op (repeatable)")
    parser.add_argument(
        "--stub", action="store_true",
        help=f"print the typed Ops module instead (regenerate with: accord contracts --stub > {STUB_PATH})",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = args.op or list(CONTRACTS)
    unknown = [n for n in names if n not in CONTRACTS]
    if unknown:
        print(f"unknown op(s): {', '.join(unknown)}; known: {', '.join(CONTRACTS)}")
        return 2
    render = render_ops_stub if args.stub else render_reference
    print(render(CONTRACTS[n] for n in names), end="")
    return 0
