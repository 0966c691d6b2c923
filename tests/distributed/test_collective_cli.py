"""`accord conformance --backend cpu --world-size 2` runs the collective cases on two
gloo ranks, prints one line per case and exits 0 when none failed."""

from __future__ import annotations

import pytest

from accord.cli.main import main


@pytest.mark.slow
def test_conformance_world_size_2_on_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "--backend", "cpu", "--world-size", "2"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "64 collective cases on 2 ranks, 0 failed"
    by_case = {line.split()[0]: line.split()[1] for line in lines[:-1]}
    assert by_case["all_gather[fp32,zero-rank]"] == "passed"
    assert by_case["all_reduce[fp8e4m3fn,even]"] == "adapted"
    assert by_case["all_reduce[complex64,even]"] == "refused"
