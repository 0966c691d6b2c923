"""`accord contracts`: print the op contract reference (Markdown), or with `--stub` the
typed `Ops` module editors and type checkers read; `--write` regenerates both files of
a checkout (what adding an op asks after its contract, kernel and cases)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ...op_contracts import CONTRACTS
from ...op_contracts.render import render_reference
from ...op_contracts.stub import STUB_PATH, render_ops_stub

#: The rendered reference, relative to the checkout.
REFERENCE_PATH = "docs/contracts.md"
#: The checkout this package runs from (the generated files live in it).
CHECKOUT = Path(__file__).resolve().parents[3]


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
    parser.add_argument(
        "--write", action="store_true",
        help=f"rewrite {REFERENCE_PATH} and {STUB_PATH} of this checkout from the contracts",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.write:
        for path, render in ((REFERENCE_PATH, render_reference), (STUB_PATH, render_ops_stub)):
            (CHECKOUT / path).write_text(render(CONTRACTS.values()))
            print(f"wrote {CHECKOUT / path}")
        return 0
    names = args.op or list(CONTRACTS)
    unknown = [n for n in names if n not in CONTRACTS]
    if unknown:
        print(f"unknown op(s): {', '.join(unknown)}; known: {', '.join(CONTRACTS)}")
        return 2
    render = render_ops_stub if args.stub else render_reference
    print(render(CONTRACTS[n] for n in names), end="")
    return 0
