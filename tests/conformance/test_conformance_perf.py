"""`accord conformance --perf`: every legal case's kernel timed, GEMMs in GFLOP/s from
their multiply-adds against a large matmul's rate in their dtype, the rest in GB/s of
the bytes they touch against the measured copy bandwidth; refused cases left to the
correctness table."""

from __future__ import annotations

import pytest

from accord.backends import get_backend
from accord.cli.main import main
from accord.conformance import cases_for
from accord.conformance.perf import run_perf


def test_gemms_report_gflops_from_their_multiply_adds_and_the_rest_bandwidth() -> None:
    linear = next(c for c in cases_for("linear") if c.name == "T=3 K=72 N=42")
    norm = next(c for c in cases_for("rms_norm") if c.name == "T=7 H=96")
    refused = next(c for c in cases_for("rms_norm") if c.expect_refusal)
    roofs, (gemm, memory) = run_perf(get_backend("cpu"), [linear, norm, refused])
    bandwidth, (gemm_roof,) = roofs.bandwidth, roofs.gemm_rates().values()
    assert bandwidth > 0 and gemm_roof > 0
    assert gemm.unit == "GFLOP/s" and gemm.roofline == pytest.approx(gemm.rate / gemm_roof)
    assert gemm.rate * gemm.seconds * 1e9 == pytest.approx(2 * 3 * 72 * 42)
    touched = 2 * 7 * 96 * norm.args["x"].element_size() + 96 * norm.args["weight"].element_size()
    assert memory.unit == "GB/s" and memory.rate * memory.seconds * 1e9 == pytest.approx(touched)
    assert memory.roofline == pytest.approx(memory.rate / bandwidth)


def test_the_perf_flag_prints_the_table_after_the_checks(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", "cpu", "--op", "silu_and_mul", "--perf"]) == 0
    out = capsys.readouterr().out
    assert "copy bandwidth" in out and "GB/s" in out
    table = out[out.index("perf of backend"):].splitlines()
    lines = [line for line in table if line.startswith("silu_and_mul ")]
    assert len(lines) == sum(not c.expect_refusal for c in cases_for("silu_and_mul"))


def test_an_fp8_gemm_has_no_roofline() -> None:
    fp8 = next(c for c in cases_for("scaled_mm") if not c.expect_refusal and c.args["a"].element_size() == 1)
    roofs, (timed,) = run_perf(get_backend("cpu"), [fp8])
    assert timed.unit == "GFLOP/s" and timed.rate > 0 and timed.roofline is None
    assert fp8.args["a"].dtype not in roofs.gemm_rates()
