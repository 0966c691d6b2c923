"""Runs every case of every contract on a backend and judges it against the reference
backend: refusals for illegal calls, then poison, guards, numerics, determinism and
batch invariance for legal ones."""

from __future__ import annotations

import time
from typing import Callable, Iterable

import torch

from ..backends import Backend
from ..op_contracts import CONTRACTS, ContractError, OpDispatcher
from .case import Case, row_aligned_outputs
from .cases import GENERATORS, cases_for
from .compare import compare_outputs, same_bits
from .execute import Execution, execute
from .results import CaseResult, ConformanceReport, Status

#: Called after each op with its results and the seconds it took (progress lines).
OpProgress = Callable[[str, list[CaseResult], float], None]


class ConformanceRunner:
    """Checks `backend` against `reference` (the golden) on seeded cases."""

    def __init__(self, backend: Backend, reference: Backend, seed: int = 0) -> None:
        self.backend = backend
        self.reference = reference
        self.seed = seed
        self._ops = OpDispatcher(backend, strict=True)
        self._golden = OpDispatcher(reference, strict=True)
        # Cases are generated on the CPU (the same bits everywhere) and copied over.
        self._device = backend.device()

    def run(self, ops: Iterable[str] | None = None, progress: OpProgress | None = None) -> ConformanceReport:
        """Run the named ops (default: every contract) and return the report."""
        started = time.perf_counter()
        results: list[CaseResult] = []
        for op in ops or CONTRACTS:
            op_started = time.perf_counter()
            op_results = self.run_op(op)
            results += op_results
            if progress is not None:
                progress(op, op_results, time.perf_counter() - op_started)
        return ConformanceReport(
            self.backend.name, self.reference.name, self.seed, tuple(results), time.perf_counter() - started
        )

    def run_op(self, op: str) -> list[CaseResult]:
        """Every case of `op`; a registry hole (no reference kernel, no cases) fails."""
        if op not in CONTRACTS:
            raise KeyError(f"no op contract named {op!r}; known: {', '.join(sorted(CONTRACTS))}")
        if self.reference.kernel_for(op) is None:
            return [CaseResult(op, "registry", "-", Status.FAIL, f"contract has no {self.reference.name} kernel")]
        if op not in GENERATORS:
            return [CaseResult(op, "registry", "-", Status.FAIL, "contract has no conformance cases")]
        return [self.run_case(case) for case in cases_for(op, self.seed)]

    def run_case(self, case: Case) -> CaseResult:
        """Judge one case: refused as declared, or run and compared."""
        if case.expect_refusal:
            return self._check_refusal(case)
        return self._check_legal(case)

    def _check_refusal(self, case: Case) -> CaseResult:
        try:
            execute(self._ops, case, case.fresh_args(self._device))
        except ContractError as error:
            return _result(case, Status.REFUSED, str(error))
        except Exception as error:  # noqa: BLE001 - any other outcome is the finding
            return _result(case, Status.FAIL, f"raised {type(error).__name__} instead of ContractError: {error}")
        return _result(case, Status.FAIL, "illegal call was accepted and ran")

    def _check_legal(self, case: Case) -> CaseResult:
        try:
            want = execute(self._golden, case, case.fresh_args(self.reference.device()))
        except Exception as error:  # noqa: BLE001 - a broken golden or case is a failure
            return _result(case, Status.FAIL, f"the reference failed: {type(error).__name__}: {error}")
        try:
            got = execute(self._ops, case, case.fresh_args(self._device))
        except ContractError as error:
            return _result(case, Status.UNSUPPORTED, str(error))
        except Exception as error:  # noqa: BLE001 - a crashing kernel is the finding
            return _result(case, Status.FAIL, f"kernel raised {type(error).__name__}: {error}")
        tolerance, note = self._tolerance(case, want)
        comparison = compare_outputs(case.contract, case.args, got.outputs, want.outputs, tolerance)
        reference_problems = [f"reference: {problem}" for problem in want.problems]
        problems = [*reference_problems, *got.problems, *comparison.failures]
        return CaseResult(
            op=case.op,
            case=case.name,
            combo=case.combo,
            status=Status.FAIL if problems else Status.PASS,
            message="; ".join(problems),
            error=comparison.worst_error,
            tolerance=tolerance,
            deterministic=self._deterministic(case, got),
            batch_invariant=self._batch_invariant(case, got),
            tolerance_note=note,
            adapters=self._adapters(case),
        )

    def _adapters(self, case: Case) -> str:
        """The declared casts the dispatcher applies to this case's signature."""
        plan = self._ops.plan_for(case.op, **case.fresh_args(self._device))
        return ", ".join(a.describe(plan.signature.dtype(a.arg)) for a in plan.adapters)  # type: ignore[arg-type]

    def _tolerance(self, case: Case, want: Execution) -> tuple[float, str]:
        """The contract's bound for this case's dtypes, or the backend's declared
        override with a note saying so."""
        contract = case.contract
        dtypes = {name: t.dtype for name, t in case.args.items() if isinstance(t, torch.Tensor)}
        dtypes.update({name: t.dtype for name, t in want.outputs.items()})
        tolerance = contract.tolerance_for(dtypes)
        override = self.backend.tolerance_override(case.op, dtypes[contract.primary])
        if override is None:
            return tolerance, ""
        return override.nmse, f"tolerance {tolerance:g} -> {override.nmse:g} declared by backend: {override.reason}"

    def _deterministic(self, case: Case, first: Execution) -> bool:
        """Whether a second run gives the same bits."""
        try:
            second = execute(self._ops, case, case.fresh_args(self._device))
        except Exception:  # noqa: BLE001 - failing the second time is nondeterminism
            return False
        return all(same_bits(first.outputs[name], second.outputs[name]) for name in first.outputs)

    def _batch_invariant(self, case: Case, full: Execution) -> bool | None:
        """Whether the first row alone gives the bits it got among its batch mates
        (None when rows are not independent or there is only one)."""
        if not case.row_independent or case.row_count() < 2:
            return None
        try:
            alone = execute(self._ops, case, case.first_rows(1, self._device))
        except Exception:  # noqa: BLE001 - refusing a sub-batch is a variance
            return False
        return all(
            same_bits(alone.outputs[name], full.outputs[name][:1])
            for name in row_aligned_outputs(case.contract, case.args)
        )


def _result(case: Case, status: Status, message: str) -> CaseResult:
    return CaseResult(case.op, case.name, case.combo, status, message)
