"""Determinism and batch invariance are reported per op and fail the gate only when
the deploy config requires them."""

from __future__ import annotations

from accord.conformance import CaseResult, Status
from accord.gate.deploy import batch_invariant_mode_check, requirement_checks
from accord.gate.deploy_config import GateSettings
from accord.gate.reports import CheckStatus, GateReport

STEADY = CaseResult("rms_norm", "T=4", "x=fp32", Status.PASS, deterministic=True, batch_invariant=True)
BATCH_DEPENDENT = CaseResult("fused_moe", "T=4", "x=bf16", Status.PASS, deterministic=True, batch_invariant=False)


def statuses(gate: GateSettings, *results: CaseResult) -> dict[str, CheckStatus]:
    """Each requirement check's status by name."""
    return {check.name: check.status for check in requirement_checks(gate, results)}


def test_ops_that_hold_both_properties_pass() -> None:
    assert statuses(GateSettings(), STEADY) == {
        "all ops supported": CheckStatus.PASS, "determinism": CheckStatus.PASS, "batch invariance": CheckStatus.PASS}


def test_a_batch_dependent_op_is_a_warning_when_not_required() -> None:
    assert statuses(GateSettings(), STEADY, BATCH_DEPENDENT)["batch invariance"] is CheckStatus.WARN


def test_a_batch_dependent_op_fails_when_required() -> None:
    gate = GateSettings(require_batch_invariance=True)
    (check,) = [c for c in requirement_checks(gate, [STEADY, BATCH_DEPENDENT]) if c.name == "batch invariance"]
    assert check.status is CheckStatus.FAIL
    assert "fused_moe" in check.message and "rms_norm" not in check.message


def test_a_warning_does_not_fail_the_report() -> None:
    report = GateReport({"backend": "cpu"}, None, tuple(requirement_checks(GateSettings(), [BATCH_DEPENDENT])))
    assert report.passed


DECLINED = CaseResult("scaled_mm", "M=5", "a,b=fp8e4m3fn", Status.UNSUPPORTED, "no fp8 here")


def test_an_unsupported_op_is_a_warning_unless_all_ops_are_required() -> None:
    assert statuses(GateSettings(), STEADY, DECLINED)["all ops supported"] is CheckStatus.WARN
    assert statuses(GateSettings(require_all_ops=True), STEADY, DECLINED)["all ops supported"] is CheckStatus.FAIL


def test_the_report_states_the_batch_invariant_mode_on_and_off() -> None:
    on, off = batch_invariant_mode_check(True), batch_invariant_mode_check(False)
    assert on.name == off.name == "batch-invariant mode" and on.status is off.status is CheckStatus.PASS
    assert on.message.startswith("on:") and off.message.startswith("off:")
    assert (on.figures["on"], off.figures["on"]) == (1, 0)
