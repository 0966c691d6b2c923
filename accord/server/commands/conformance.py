"""`accord conformance`: run every op contract's seeded cases on a backend, judged
against the reference backend; print the matrix and exit non-zero on any failure."""

from __future__ import annotations

import argparse
import sys

import torch

from ...backends import BackendUnavailableError, UnknownBackendError, default_registry
from ...conformance import CaseResult, ConformanceRunner, cases_for
from ...conformance.table import render, verdict
from ...op_contracts import CONTRACTS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "conformance",
        help="check a backend against the op contracts and the reference backend",
        description="Run seeded cases for every op contract on a backend, compare with the reference backend, "
        "print an op x dtype matrix and exit 1 on any failure.",
    )
    parser.add_argument("--backend", default="auto", help="backend to check (default: auto)")
    parser.add_argument("--reference", default="reference", help="the golden backend (default: reference)")
    parser.add_argument("--op", action="append", choices=sorted(CONTRACTS), metavar="NAME",
                        help="check only this op (repeatable; default: every contract)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated cases (default: 0)")
    parser.add_argument("--list", action="store_true", help="print the cases without running them")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (default 1: the cases are small, and a thread pool "
                        "on a busy host costs more than it gives)")
    parser.set_defaults(func=run)


def _list_cases(ops: list[str], seed: int) -> int:
    for op in ops:
        for case in cases_for(op, seed):
            expectation = "must be refused" if case.expect_refusal else "run"
            print(f"{op}  [{case.combo}]  {case.name}  ({expectation})")
    return 0


def _progress(op: str, results: list[CaseResult], seconds: float) -> None:
    print(f"  {op:<22} {len(results):>4} cases  {seconds:6.2f}s  {verdict(results)}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    ops = args.op or list(CONTRACTS)
    if args.list:
        return _list_cases(ops, args.seed)
    try:
        backend = default_registry().get(args.backend)
        reference = default_registry().get(args.reference)
    except (UnknownBackendError, BackendUnavailableError) as error:
        print(f"accord conformance: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    report = ConformanceRunner(backend, reference, args.seed).run(ops, progress=_progress)
    print(render(report))
    return 1 if report.failed else 0
