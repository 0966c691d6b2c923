"""Runs every case of every contract on a backend and judges it against the reference
backend: refusals for illegal calls, then poison, guards, numerics, determinism and
batch invariance for legal ones."""

from __future__ import annotations

import time
from typing import Callable, Iterable

import torch

from ..backends import Backend
from ..op_contracts import CONTRACTS, ContractError, OpDispatcher
from .batches import units
from .case import Case
from .cases import GENERATORS, cases_for
from .compare import NMSE, ULPS, compare_outputs, same_bits
from .draws import STATISTICAL_CHECKS
from .execute import Execution, execute
from .results import CaseResult, ConformanceReport, Status

#: Called after each op with its results and the seconds it took (progress lines).
OpProgress = Callable[[str, list[CaseResult], float], None]


class ConformanceRunner:
    """Checks `backend` against `reference` (the golden) on seeded cases. With
    `batch_invariant` it checks the kernels `--batch-invariant` runs instead: every
    op's batch-invariant kernel (none is unsupported), whose rows must give the same
    bits at several row counts, whatever the backend declares."""

    def __init__(self, backend: Backend, reference: Backend, seed: int = 0, batch_invariant: bool = False) -> None:
        self.backend = backend
        self.reference = reference
        self.seed = seed
        self.batch_invariant = batch_invariant
        self._ops = OpDispatcher(backend, strict=True, batch_invariant=batch_invariant)
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
        tolerance, by_ulps, note = self._tolerance(case, want)
        comparison = compare_outputs(case.contract, case.args, got.outputs, want.outputs, tolerance, by_ulps)
        worst = comparison.worst
        reference_problems = [f"reference: {problem}" for problem in want.problems]
        deterministic = self._deterministic(case, got)
        # Bits that change from call to call say nothing about batch mates.
        variant_units = self._batch_variant_units(case, got) if deterministic else None
        statistical = STATISTICAL_CHECKS.get(case.op)
        drawn = statistical(case.args, got.outputs) if statistical and not got.problems else []
        problems = [*reference_problems, *got.problems, *comparison.failures, *drawn,
                    *self._undeclared(case.op, deterministic, variant_units)]
        passed = Status.SHARED if self.shares_reference_kernel(case.op) else Status.PASS
        return CaseResult(
            op=case.op,
            case=case.name,
            combo=case.combo,
            status=Status.FAIL if problems else passed,
            message="; ".join(problems) or self._declarations(case.op, deterministic, variant_units),
            error=None if worst is None else worst.error,
            tolerance=tolerance if worst is None else worst.tolerance,
            unit=ULPS if by_ulps else NMSE,
            deterministic=deterministic,
            batch_invariant=None if variant_units is None else not variant_units,
            tolerance_note=note,
            adapters=self._adapters(case),
        )

    def shares_reference_kernel(self, op: str) -> bool:
        """Whether the backend runs the reference's own kernel for `op` (a comparison
        of the reference with itself, reported as `shared`, never as a pass)."""
        mine, golden = self.backend.kernel_for(op, self.batch_invariant), self.reference.kernel_for(op)
        return mine is not None and golden is not None and mine.fn is golden.fn

    def _undeclared(self, op: str, deterministic: bool, variant_units: list[str] | None) -> list[str]:
        """Determinism and batch invariance fail a case unless the backend declares the
        op nondeterministic or batch-variant."""
        problems = []
        if not deterministic and op not in self.backend.nondeterministic_ops():
            problems.append("two identical calls gave different bits, and the backend does not declare "
                            "the op nondeterministic (Backend.nondeterministic_ops)")
        if variant_units and self.batch_invariant:
            problems.append(f"{', '.join(variant_units)} gave other bits than in the full batch, under the kernel "
                            "batch-invariant mode runs")
        elif variant_units and op not in self.backend.batch_variant_ops():
            problems.append(f"{', '.join(variant_units)} alone gave other bits than in the batch, and the backend "
                            "does not declare the op batch-variant (Backend.batch_variant_ops)")
        return problems

    def _declarations(self, op: str, deterministic: bool, variant_units: list[str] | None) -> str:
        """For a passing case: the declared exceptions this case made use of."""
        notes = []
        if not deterministic:
            notes.append("nondeterministic (declared by the backend)")
        if variant_units:
            notes.append(f"batch-variant (declared by the backend): {', '.join(variant_units)}")
        return "; ".join(notes)

    def _adapters(self, case: Case) -> str:
        """The declared casts the dispatcher applies to this case's signature."""
        plan = self._ops.plan_for(case.op, **case.fresh_args(self._device))
        return ", ".join(a.describe(plan.signature.dtype(a.arg)) for a in plan.adapters)  # type: ignore[arg-type]

    def _tolerance(self, case: Case, want: Execution) -> tuple[float, bool, str]:
        """The contract's rule for this case's dtypes (its NMSE bound, and whether its
        ulps bound applies instead), or the backend's declared NMSE override with a note
        saying so (an override judges an op rounded once by NMSE too)."""
        contract = case.contract
        dtypes = {name: v for name, v in case.args.items() if isinstance(v, torch.dtype)}
        dtypes.update({name: t.dtype for name, t in case.args.items() if isinstance(t, torch.Tensor)})
        dtypes.update({name: t.dtype for name, t in want.outputs.items()})
        tolerance = contract.tolerance_for(dtypes)
        override = self.backend.tolerance_override(case.op, dtypes)
        if override is None:
            return tolerance, contract.ulps is not None, ""
        bound = f"{contract.ulps_for(dtypes[contract.primary])} ulps" if contract.ulps else f"NMSE {tolerance:g}"
        return override.nmse, False, f"tolerance {bound} -> NMSE {override.nmse:g} declared by backend: {override.reason}"

    def _deterministic(self, case: Case, first: Execution) -> bool:
        """Whether a second run gives the same bits."""
        try:
            second = execute(self._ops, case, case.fresh_args(self._device))
        except Exception:  # noqa: BLE001 - failing the second time is nondeterminism
            return False
        return all(same_bits(first.outputs[name], second.outputs[name]) for name in first.outputs)

    def _batch_variant_units(self, case: Case, full: Execution) -> list[str] | None:
        """The rows, sequences or tokens whose output alone differs from theirs in the
        batch (None when the case has no independent units to check)."""
        checked = units(case, self._device, several_row_counts=self.batch_invariant)
        if not checked:
            return None
        variant = []
        for unit in checked:
            try:
                alone = execute(self._ops, case, unit.args)
            except Exception:  # noqa: BLE001 - refusing a sub-batch is a variance
                variant.append(unit.label)
                continue
            if not unit.agrees(full.outputs, alone.outputs):
                variant.append(unit.label)
        return variant


def _result(case: Case, status: Status, message: str) -> CaseResult:
    return CaseResult(case.op, case.name, case.combo, status, message)
