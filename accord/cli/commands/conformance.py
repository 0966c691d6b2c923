"""`accord conformance`: run every op contract's seeded cases on a backend, judged
against the reference backend; print the matrix and exit non-zero on any failure.
`--deploy deploy.yaml` runs the rollout gate for a production config instead,
`--report-dir` writes report.json, junit.xml and report.html, and
`accord conformance merge a.json b.json ...` builds the cross-vendor matrix.
`--world-size N` runs the collective contracts' cases on N ranks instead; the default
run (every op) includes them on 2 ranks where the backend has a communicator, unless
`--no-collectives`."""

from __future__ import annotations

import argparse
import sys

import torch

from ...backends import Backend, BackendUnavailableError, UnknownBackendError, default_registry
from ...op_contracts import CONTRACTS

# The suite and the gate (their cases, reports, YAML and XML) are imported when this
# command runs: every `accord` command builds this parser, `accord serve` included.


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "conformance",
        help="check a backend against the op contracts and the reference backend",
        description="Run seeded cases for every op contract on a backend, compare with the reference backend, "
        "print an op x dtype matrix and exit 1 on any failure.",
    )
    parser.add_argument("--backend", default=None,
                        help="backend to check (default: auto, or the deploy config's backend with --deploy)")
    parser.add_argument("--reference", default="reference", help="the golden backend (default: reference)")
    parser.add_argument("--op", action="append", choices=sorted(CONTRACTS), metavar="NAME",
                        help="check only this op (repeatable; default: every contract)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated cases (default: 0)")
    parser.add_argument("--list", action="store_true", help="print the cases without running them")
    parser.add_argument("--verbose", action="store_true",
                        help="list each case's declared exceptions (the batch-variant rows, say) instead of one line "
                        "per op")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads for the op checks (default 1: the cases are small, and a thread "
                        "pool on a busy host costs more than it gives; --deploy keeps production's threading)")
    parser.add_argument("--world-size", type=int, default=1, metavar="N",
                        help="run the collective cases (all_reduce, all_gather, reduce_scatter, all_to_all over the "
                        "backend's communicator and dtype contract) on N spawned ranks instead of the op cases")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="check the kernels `--batch-invariant` runs: each op's batch-invariant kernel (none: "
                        "unsupported), every row case at several row counts, bit for bit")
    parser.add_argument("--perf", action="store_true",
                        help="also time every legal case's kernel and print GFLOP/s (GEMMs) or GB/s against the "
                        "host's measured copy bandwidth, one line per case")
    parser.add_argument("--no-collectives", action="store_true",
                        help="skip the 2-rank collective section the default run (every op) includes on a backend "
                        "with a communicator")
    parser.add_argument("--deploy", metavar="YAML",
                        help="run the rollout gate for this deploy config (docs/rollout_gate.md)")
    parser.add_argument("--report-dir", metavar="DIR", help="write report.json, junit.xml and report.html into DIR")
    parser.add_argument("--require-all", action="store_true",
                        help="exit 1 when the backend declines any case (unsupported) of the ops checked; with "
                        "--deploy, same as gate.require_all_ops")
    parser.set_defaults(func=run)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    merge = actions.add_parser("merge", help="merge report.json files of several nodes into one cross-vendor matrix",
                               description="Merge report.json files of several nodes into one cross-vendor matrix, "
                               "flag cases where two backends disagree with each other by more than either disagrees "
                               "with the reference, and exit 1 on any failed node or disagreement.")
    merge.add_argument("reports", nargs="+", metavar="REPORT_JSON", help="report.json files to merge")
    merge.add_argument("--report-dir", dest="merge_report_dir", metavar="DIR",
                       help="write the merged report.json, junit.xml and report.html into DIR")
    merge.set_defaults(func=_merge)


def _list_cases(ops: list[str], seed: int) -> int:
    from ...conformance import cases_for

    for op in ops:
        for case in cases_for(op, seed):
            expectation = "must be refused" if case.expect_refusal else "run"
            print(f"{op}  [{case.combo}]  {case.name}  ({expectation})")
    return 0


def _merge(args: argparse.Namespace) -> int:
    from ...gate.gate_command import run_merge

    return run_merge(args.reports, args.merge_report_dir)


def run(args: argparse.Namespace) -> int:
    from ...conformance import ConformanceRunner
    from ...conformance.collectives import render_collectives, run_collective_conformance
    from ...conformance.table import render
    from ...gate.gate_command import print_op_progress, run_deploy, write_op_reports

    if args.deploy:  # production threading: the thread count can change a reduction's rounding
        return run_deploy(args.deploy, report_dir=args.report_dir, backend=args.backend, ops=args.op,
                          list_only=args.list, require_all=args.require_all, verbose=args.verbose)
    ops = args.op or list(CONTRACTS)
    if args.list:
        return _list_cases(ops, args.seed)
    try:
        backend = default_registry().get(args.backend or "auto")
        reference = default_registry().get(args.reference)
    except (UnknownBackendError, BackendUnavailableError) as error:
        print(f"accord conformance: {error}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    if args.world_size > 1:
        results = run_collective_conformance(backend.name, args.world_size, args.seed)
        print(render_collectives(results))
        return 1 if any(r.status == "failed" for r in results) else 0
    collectives_failed = _collective_section(args, backend)
    runner = ConformanceRunner(backend, reference, args.seed, batch_invariant=args.batch_invariant)
    report = runner.run(ops, progress=print_op_progress)
    print(render(report, verbose=args.verbose))
    if args.perf:
        _print_perf(backend, ops, args.seed)
    if args.report_dir:
        write_op_reports(report, backend, reference, args.report_dir)
    failed = report.failed or collectives_failed or (args.require_all and report.unsupported_ops())
    return 1 if failed else 0


def _print_perf(backend: Backend, ops: list[str], seed: int) -> None:
    """The perf table of every legal case of `ops` on `backend`."""
    from ...conformance import cases_for
    from ...conformance.perf import render_perf, run_perf

    roofs, timed = run_perf(backend, (case for op in ops for case in cases_for(op, seed)))
    print(render_perf(backend.name, roofs, timed))


#: The ranks of the default run's collective section.
COLLECTIVE_RANKS = 2


def _collective_section(args: argparse.Namespace, backend: Backend) -> bool:
    """The default run's collectives on COLLECTIVE_RANKS spawned ranks, printed before
    the op table (which stays last), or a line saying why they were skipped; True when
    a case failed."""
    from ...conformance.collectives import render_collectives, run_collective_conformance

    if args.no_collectives or args.op:
        why = "--no-collectives" if args.no_collectives else "--op selects ops only"
        print(f"collectives: skipped ({why}; --world-size N runs them alone)")
        return False
    try:
        backend.collective_support()
    except NotImplementedError as missing:
        print(f"collectives: skipped (no communicator: {missing})")
        return False
    results = run_collective_conformance(backend.name, COLLECTIVE_RANKS, args.seed)
    print(render_collectives(results))
    return any(r.status == "failed" for r in results)
