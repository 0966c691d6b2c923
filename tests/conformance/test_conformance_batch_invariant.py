"""Conformance's batch-invariant run (the kernels `--batch-invariant` runs): each row
case also runs at several row counts and must give the same bits for every row, whatever
the backend declares. The cpu backend's row-tiled variants pass; its default kernels,
claimed invariant, fail; an op declared batch-variant with no variant is unsupported."""

from __future__ import annotations

import pytest
from conformance_doubles import broken, rms_norm_depending_on_batch_size

from accord.backends import get_backend
from accord.conformance import ConformanceRunner, Status, cases_for

#: The ops the cpu backend declares batch-variant, and so registers variants of.
VARIANT_OPS = ("linear", "scaled_mm", "moe_route", "fused_moe", "group_quant_linear")


def _row_cases(op: str, limit: int | None = 12) -> list:
    """`op`'s legal row cases with at least 5 rows (several row counts to compare), the
    first `limit` of them (None: all)."""
    return [c for c in cases_for(op) if not c.expect_refusal and c.row_independent and c.row_count() >= 5][:limit]


class DefaultKernelsClaimedInvariant(type(get_backend("cpu"))):  # type: ignore[misc]
    """The cpu backend handing its default kernels to batch-invariant mode."""

    name = "cpu-default-claimed-invariant"

    def kernel_for(self, op: str, batch_invariant: bool = False):  # type: ignore[no-untyped-def]
        return super().kernel_for(op)


@pytest.mark.parametrize("op", VARIANT_OPS)
def test_the_cpu_batch_invariant_variants_pass_at_several_row_counts(op: str) -> None:
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"), batch_invariant=True)
    results = [runner.run_case(case) for case in _row_cases(op)]
    assert results and {r.status for r in results} == {Status.PASS}, [r.message for r in results]
    assert all(r.batch_invariant for r in results)


@pytest.mark.parametrize("op", VARIANT_OPS)
def test_the_cpu_default_kernels_claimed_invariant_fail_naming_the_rows(op: str) -> None:
    runner = ConformanceRunner(DefaultKernelsClaimedInvariant(), get_backend("reference"), batch_invariant=True)
    results = [runner.run_case(case) for case in _row_cases(op, None if op == "moe_route" else 12)]
    failed = [r for r in results if r.status is Status.FAIL]
    assert failed and all("under the kernel batch-invariant mode runs" in r.message for r in failed)


def test_an_op_declared_batch_variant_without_a_variant_is_unsupported_in_the_mode() -> None:
    double = broken("batchy", "rms_norm", rms_norm_depending_on_batch_size, "batch_variant")
    runner = ConformanceRunner(double, get_backend("reference"), batch_invariant=True)
    results = [runner.run_case(c) for c in cases_for("rms_norm") if not c.expect_refusal]
    assert {r.status for r in results} == {Status.UNSUPPORTED}
    assert all("a batch-invariant kernel" in r.message for r in results)
