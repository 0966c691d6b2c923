"""`accord conformance`: the table, the exit status, --op and --list."""

from __future__ import annotations

import re

import pytest
from conformance_doubles import broken, rms_norm_depending_on_batch_size, rms_norm_writing_half_the_columns

from accord.backends import Backend, get_backend
from accord.conformance import cases_for
from accord.op_contracts import CONTRACTS
from accord.cli.main import main
from accord.cli.commands import conformance as command


class FixedRegistry:
    """Stands in for the plugin registry with a fixed set of backends."""

    def __init__(self, *backends: Backend) -> None:
        self._backends = {backend.name: backend for backend in backends}

    def get(self, name: str) -> Backend:
        return self._backends[name]


@pytest.mark.slow
def test_cpu_backend_passes_every_contract(capsys: pytest.CaptureFixture[str]) -> None:
    # The collective section has its own tests (below, and tests/distributed's 2-rank run).
    assert main(["conformance", "--backend", "cpu", "--no-collectives"]) == 0
    summary = capsys.readouterr().out.splitlines()[-1]
    assert summary.startswith("OK:") and f"over {len(CONTRACTS)} ops" in summary
    assert "fail 0" in summary and "unsupported 0" in summary


def test_op_filter_runs_only_that_op(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", "reference", "--op", "silu_and_mul"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert f"{len(cases_for('silu_and_mul'))} cases over 1 ops" in last


def test_a_failing_backend_exits_non_zero_and_names_the_failure(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    half_writer = broken("half-writer", "rms_norm", rms_norm_writing_half_the_columns)
    monkeypatch.setattr(command, "default_registry", lambda: FixedRegistry(half_writer, get_backend("reference")))
    assert main(["conformance", "--backend", "half-writer", "--op", "rms_norm"]) == 1
    out = capsys.readouterr().out
    # Every case of every dtype column fails (the adversarial draws add to the columns).
    assert re.search(r"FAIL (\d+)/\1 ", out) and "never written" in out and out.splitlines()[-1].startswith("FAILED:")


def test_unknown_backend_exits_2_with_the_known_names(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", "no-such-backend"]) == 2
    assert "Supported items" in capsys.readouterr().err


def test_list_prints_every_case_without_running(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(command, "default_registry", lambda: pytest.fail("--list must not load a backend"))
    assert main(["conformance", "--list", "--op", "moe_route"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(cases_for("moe_route"))
    refusals = sum(case.expect_refusal for case in cases_for("moe_route"))
    assert sum(line.endswith("(must be refused)") for line in lines) == refusals


def test_the_default_run_includes_a_2_rank_collective_section_whose_failure_fails_it(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from accord.conformance import collectives
    from accord.conformance.collectives import CollectiveResult

    asked = []

    def one_failure(backend_name: str, world_size: int, seed: int) -> list[CollectiveResult]:
        asked.append((backend_name, world_size))
        return [CollectiveResult("all_reduce[fp32,even]", 0, "failed", "result differs")]

    monkeypatch.setattr(collectives, "run_collective_conformance", one_failure)
    monkeypatch.setattr(command, "CONTRACTS", {"silu_and_mul": CONTRACTS["silu_and_mul"]})
    assert main(["conformance", "--backend", "reference"]) == 1
    assert asked == [("reference", 2)]
    assert "1 collective cases on 1 ranks, 1 failed" in capsys.readouterr().out


def test_no_collectives_skips_the_section_and_says_so(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from accord.conformance import collectives

    monkeypatch.setattr(collectives, "run_collective_conformance", lambda *a: pytest.fail("must not run"))
    monkeypatch.setattr(command, "CONTRACTS", {"silu_and_mul": CONTRACTS["silu_and_mul"]})
    assert main(["conformance", "--backend", "reference", "--no-collectives"]) == 0
    assert "collectives: skipped (--no-collectives" in capsys.readouterr().out


def test_batch_invariant_flag_runs_the_invariant_kernels(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    batchy = broken("batchy", "rms_norm", rms_norm_depending_on_batch_size, "batch_variant")
    monkeypatch.setattr(command, "default_registry", lambda: FixedRegistry(batchy, get_backend("reference")))
    assert main(["conformance", "--backend", "batchy", "--op", "rms_norm"]) == 0  # declared: passes
    assert main(["conformance", "--backend", "batchy", "--op", "rms_norm", "--batch-invariant",
                 "--require-all"]) == 1  # no invariant kernel: unsupported
    assert "a batch-invariant kernel" in capsys.readouterr().out
