"""The runner catches deliberately broken backends, and only what is broken: each test
swaps one reference kernel for a plausible bug and checks the verdicts."""

from __future__ import annotations

import pytest
import torch
from conformance_doubles import (
    PatchedReference,
    WideToleranceBackend,
    broken,
    reference_fn,
    rms_norm_depending_on_batch_size,
    rms_norm_off_by_a_thousandth,
    rms_norm_with_noise,
    rms_norm_writing_half_the_columns,
    rms_norm_writing_past_its_output,
    route_reading_companions_at_token_id_width,
    route_without_renormalisation,
)

from accord.backends import Backend, get_backend
from accord.conformance import CaseResult, ConformanceRunner, Status
from accord.conformance.table import render
from accord.op_contracts import CastAdapter, Kernel


def run_op(backend: Backend, op: str) -> list[CaseResult]:
    return ConformanceRunner(backend, get_backend("reference")).run_op(op)


def statuses(results: list[CaseResult]) -> set[Status]:
    return {r.status for r in results}


@pytest.mark.slow
def test_reference_against_itself_is_shared_never_passed_and_refuses_illegal_calls() -> None:
    results = run_op(get_backend("reference"), "moe_route")
    assert statuses([r for r in results if r.combo != "illegal calls"]) == {Status.SHARED}
    assert statuses([r for r in results if r.combo == "illegal calls"]) == {Status.REFUSED}


@pytest.mark.slow
def test_router_reading_int32_companions_as_int64_fails_exactly_the_mixed_width_cases() -> None:
    misreading = broken("misread", "moe_route", route_reading_companions_at_token_id_width)
    results = [r for r in run_op(misreading, "moe_route") if r.case.startswith("hash")]
    mixed_widths = ("token_ids=int32 hash_table=int64", "token_ids=int64 hash_table=int32")
    mixed = [r for r in results if any(widths in r.combo for widths in mixed_widths)]
    uniform = [r for r in results if r not in mixed]
    assert mixed and statuses(mixed) == {Status.FAIL}
    assert uniform and statuses(uniform) == {Status.PASS}


@pytest.mark.slow
def test_dropped_topk_renormalisation_fails_only_renormalising_routes() -> None:
    results = [r for r in run_op(broken("no-renorm", "moe_route", route_without_renormalisation), "moe_route")
               if r.status is not Status.REFUSED]
    renormalising = [r for r in results if r.case.startswith(("sigmoid", "sqrt_softplus", "hash"))
                     and "renorm=False" not in r.case and "softmax" not in r.case]
    assert statuses(renormalising) == {Status.FAIL}
    assert all("topk_weights: NMSE" in r.message for r in renormalising)
    assert statuses([r for r in results if r.case.startswith("softmax top2") or "renorm=False" in r.case]) == {
        Status.PASS}


def test_kernel_writing_part_of_its_output_fails_with_unwritten_slots() -> None:
    results = [r for r in run_op(broken("half", "rms_norm", rms_norm_writing_half_the_columns), "rms_norm")
               if r.status is not Status.REFUSED]
    assert statuses(results) == {Status.FAIL}
    assert all("never written" in r.message for r in results)


def test_kernel_writing_past_its_output_fails_with_a_guard_breach() -> None:
    results = [r for r in run_op(broken("oob", "rms_norm", rms_norm_writing_past_its_output), "rms_norm")
               if r.status is not Status.REFUSED]
    assert statuses(results) == {Status.FAIL}
    assert all("out: 1 guard elements overwritten" in r.message for r in results)


@pytest.mark.slow
def test_unclaimed_dtypes_are_reported_unsupported_not_run_or_passed() -> None:
    int32_only = broken("int32-only", "moe_route", reference_fn("moe_route"), token_ids=(torch.int32,))
    results = run_op(int32_only, "moe_route")
    unclaimed = [r for r in results if "token_ids=int64" in r.combo]
    assert unclaimed and statuses(unclaimed) == {Status.UNSUPPORTED}
    assert all("claims int32 only" in r.message for r in unclaimed)
    assert Status.FAIL not in statuses(results)


def test_declared_tolerance_override_is_applied_and_noted() -> None:
    backend = WideToleranceBackend("wide", Kernel("rms_norm", rms_norm_off_by_a_thousandth))
    legal = [r for r in run_op(backend, "rms_norm") if r.status is not Status.REFUSED]
    assert statuses(legal) == {Status.PASS}
    assert all(r.tolerance == 1e-4 and "declared by backend" in r.tolerance_note for r in legal)


def test_without_the_override_the_same_kernel_fails() -> None:
    results = run_op(broken("no-override", "rms_norm", rms_norm_off_by_a_thousandth), "rms_norm")
    assert Status.FAIL in statuses([r for r in results if r.combo.endswith("fp32")])


def legal(results: list[CaseResult]) -> list[CaseResult]:
    return [r for r in results if r.status is not Status.REFUSED]


def test_undeclared_nondeterminism_fails() -> None:
    results = legal(run_op(broken("noisy", "rms_norm", rms_norm_with_noise), "rms_norm"))
    noisy = [r for r in results if r.deterministic is False]
    assert noisy and statuses(noisy) == {Status.FAIL}
    assert all("does not declare the op nondeterministic" in r.message for r in noisy)


def test_declared_nondeterminism_passes_and_says_so() -> None:
    results = legal(run_op(broken("noisy", "rms_norm", rms_norm_with_noise, "nondeterministic"), "rms_norm"))
    assert statuses(results) == {Status.PASS}
    assert any("nondeterministic (declared by the backend)" in r.message for r in results)


def test_undeclared_batch_variance_fails_naming_the_rows() -> None:
    results = legal(run_op(broken("batchy", "rms_norm", rms_norm_depending_on_batch_size), "rms_norm"))
    written = [r for r in results if not r.case.startswith("adversarial")]
    assert [r.batch_invariant for r in written if r.combo.endswith("fp32")] == [None, False, False]
    variant = [r for r in results if r.batch_invariant is False]
    assert statuses(variant) == {Status.FAIL}
    assert all("row 0, row 1" in r.message and "batch-variant" in r.message for r in variant)


def test_declared_batch_variance_passes_and_the_table_shows_the_declaration() -> None:
    backend = broken("batchy", "rms_norm", rms_norm_depending_on_batch_size, "batch_variant")
    report = ConformanceRunner(backend, get_backend("reference")).run(["rms_norm"])
    assert not report.failed
    assert "declared exceptions" in render(report) and "batch-variant (declared by the backend)" in render(report)


def test_contract_without_a_reference_kernel_fails_registry_completeness() -> None:
    golden_with_hole = PatchedReference("holey-reference", missing=("silu_and_mul",))
    results = ConformanceRunner(get_backend("reference"), golden_with_hole).run_op("silu_and_mul")
    assert [(r.case, r.status) for r in results] == [("registry", Status.FAIL)]


def test_backend_without_a_kernel_is_unsupported_for_every_legal_case() -> None:
    results = run_op(PatchedReference("no-silu", missing=("silu_and_mul",)), "silu_and_mul")
    assert statuses([r for r in results if r.combo != "illegal calls"]) == {Status.UNSUPPORTED}


@pytest.mark.slow
def test_declared_adapters_are_applied_and_noted() -> None:
    casting = PatchedReference(
        "casting", Kernel("moe_route", reference_fn("moe_route"), {"token_ids": (torch.int32,)}, None,
                          (CastAdapter("token_ids", torch.int32),))
    )
    results = run_op(casting, "moe_route")
    adapted = [r for r in results if "token_ids=int64" in r.combo]
    assert adapted and statuses(adapted) == {Status.PASS}
    assert {r.adapters for r in adapted} == {"cast token_ids int64->int32"}
