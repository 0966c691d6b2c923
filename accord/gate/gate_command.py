"""The command-line side of the rollout gate, for `accord conformance`: run a deploy
config, write the reports, merge reports of several nodes, and map each outcome to the
exit code (0 passed, 1 the gate failed, 2 the gate could not run)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Sequence

from ..backends import Backend, BackendUnavailableError, UnknownBackendError
from ..op_contracts import CONTRACTS
from ..conformance.cases import cases_for
from .deploy import requirement_checks, run_gate
from .deploy_config import DeployConfig, DeployConfigError, GateSettings, load_deploy_config
from .merge import merge_files
from .reports import CheckStatus, GateReport, MergedReport, write_reports
from .reports.environment import capture_environment
from .reports.samples import sample_outputs
from ..conformance.results import CaseResult, ConformanceReport
from ..conformance.table import MAX_FAILURE_LINES, render, verdict

EXIT_PASSED, EXIT_FAILED, EXIT_ERROR = 0, 1, 2


def print_op_progress(op: str, results: list[CaseResult], seconds: float) -> None:
    """One stderr line per finished op, so a long run shows where it is."""
    print(f"  {op:<22} {len(results):>4} cases  {seconds:6.2f}s  {verdict(results)}", file=sys.stderr, flush=True)


def _say(line: str) -> None:
    print(f"gate: {line}", file=sys.stderr, flush=True)


def _error(message: str) -> int:
    print(f"accord conformance: {message}", file=sys.stderr)
    return EXIT_ERROR


def run_deploy(
    deploy: str | Path,
    *,
    report_dir: str | Path | None = None,
    backend: str | None = None,
    ops: Sequence[str] | None = None,
    list_only: bool = False,
    require_all: bool = False,
    verbose: bool = False,
) -> int:
    """`accord conformance --deploy deploy.yaml`: `backend` overrides the config's
    (bisecting across backends), `ops` narrows op conformance, `list_only` prints the
    stages and standard cases without running anything, `require_all` turns on
    gate.require_all_ops, `verbose` lists each case's declared exceptions."""
    try:
        config = load_deploy_config(deploy)
        if backend is not None:
            config = dataclasses.replace(config, engine=dataclasses.replace(config.engine, backend=backend))
        if require_all:
            config = dataclasses.replace(config, gate=dataclasses.replace(config.gate, require_all_ops=True))
    except DeployConfigError as error:
        return _error(str(error))
    if list_only:
        return _list_deploy(config, ops)
    try:
        report = run_gate(config, ops=ops, say=_say, progress=print_op_progress)
    except DeployConfigError as error:  # the model cannot be found or read
        return _error(f"{deploy}: {error}")
    except (UnknownBackendError, BackendUnavailableError) as error:
        return _error(str(error))
    _print_gate(report, verbose)
    if report_dir is not None:
        _print_written(write_reports(report, report_dir))
    return EXIT_PASSED if report.passed else EXIT_FAILED


def _list_deploy(config: DeployConfig, ops: Sequence[str] | None) -> int:
    print(f"deploy gate for {config.engine.model} on backend '{config.engine.backend}':")
    print("  model: found and read as `accord serve` finds it; preflight: block_size, record_op_calls, kv_cache_dtype")
    print(f"  profile_run at max_num_seqs={config.engine.max_num_seqs} "
          f"max_num_batched_tokens={config.engine.max_num_batched_tokens}")
    print(f"  greedy comparison with '{config.gate.reference}', {config.gate.max_tokens} tokens per prompt")
    for module in config.lora_modules:
        print(f"    and under LoRA adapter '{module.name}' ({module.path})")
    print(f"  server checks: {'on' if config.gate.server_checks else 'off'}")
    print("  op conformance: the calls recorded while generating (known only at run time)"
          + (", then these standard cases:" if config.gate.standard_cases else ""))
    if config.gate.standard_cases:
        # Which ops the config calls is known only once it generates: list them all.
        for op in ops or CONTRACTS:
            for case in cases_for(op, config.gate.seed):
                print(f"    {op}  [{case.combo}]  {case.name}")
    return EXIT_PASSED


def _print_gate(report: GateReport, verbose: bool) -> None:
    """The verdict and failures first, then every check, then the op conformance
    printout; the verdict closes it again, for the terminal's last screen."""
    verdict_line = f"GATE {'PASSED' if report.passed else 'FAILED'} (backend '{report.backend}')"
    print("\n".join([verdict_line, *(f"  {line}" for line in report.failures()[:MAX_FAILURE_LINES]), ""]))
    for check in report.checks:
        print(f"[{check.status.value:>7}] {check.group}/{check.name}" + (f": {check.message}" if check.message else ""))
    for adapter in report.adapters:
        print(f"LoRA adapter served: '{adapter.name}' rank {adapter.rank} on {', '.join(adapter.target_modules)} "
              f"({adapter.path}, {adapter.weights_sha256})")
    if report.recorded:
        counts = ", ".join(f"rank {rank}: {sum(s.rank == rank for s in report.recorded)}" for rank in report.ranks)
        print(f"op signatures recorded and replayed: {counts} (report.html lists them per rank)")
    if report.conformance is not None:
        print()
        print(render(report.conformance, verbose))
    print(f"\n{verdict_line}")


def _print_written(paths: Sequence[Path]) -> None:
    print(f"reports: {', '.join(str(path) for path in paths)}")


def op_gate_report(report: ConformanceReport, backend: Backend, reference: Backend) -> GateReport:
    """A plain `accord conformance` run as a gate report (no deploy config): the
    determinism and batch-invariance findings as (reported, not failing) checks, and
    the output samples a later merge compares vendors on."""
    cases = [case for op in report.ops() for case in cases_for(op, report.seed)]
    samples = sample_outputs(backend, reference, cases, report.results)
    checks = tuple(requirement_checks(GateSettings(), report.results))
    return GateReport(capture_environment(backend), report, checks, samples)


def write_op_reports(report: ConformanceReport, backend: Backend, reference: Backend, report_dir: str | Path) -> None:
    """`accord conformance --report-dir DIR` without --deploy: the three reports."""
    _print_written(write_reports(op_gate_report(report, backend, reference), report_dir))


def run_merge(paths: Sequence[str | Path], report_dir: str | Path | None = None) -> int:
    """`accord conformance merge a.json b.json ...`: print the disagreements, write the
    merged reports, and fail when a node failed or two vendors disagree."""
    try:
        merged = merge_files(paths)
    except (OSError, ValueError) as error:  # unreadable, not JSON, not a report, not comparable
        return _error(f"merge: {error}")
    _print_merged(merged)
    if report_dir is not None:
        _print_written(write_reports(merged, report_dir))
    return EXIT_PASSED if merged.passed else EXIT_FAILED


def _print_merged(merged: MergedReport) -> None:
    for label, source in zip(merged.columns, merged.sources):
        checks_failed = sum(check.status is CheckStatus.FAIL for check in source.checks)
        cases = len(source.results)
        print(f"{label:<24} {'passed' if source.passed else 'FAILED'}  {cases} cases, {checks_failed} failed checks")
    for d in merged.disagreements:
        print(f"DISAGREE {d.op} [{d.combo}] {d.case}: {d.first} vs {d.second} {d.between:.3g} "
              f"(vs reference {d.first_vs_reference:.3g}, {d.second_vs_reference:.3g})")
    print(f"\nMERGED {'PASSED' if merged.passed else 'FAILED'}: {len(merged.disagreements)} cross-vendor disagreements")
