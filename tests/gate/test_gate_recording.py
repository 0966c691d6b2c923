"""Recording the op calls an engine makes: each new signature's inputs are copied into
a conformance case, a few shapes per signature at most, oversized calls only counted,
and the backend is left as it was."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.conformance import recording
from accord.conformance.recording import MAX_SHAPES_PER_SIGNATURE, recording_calls
from accord.op_contracts import OpDispatcher


def rms_norm_rows(*row_counts: int) -> recording.CallRecorder:
    """Record rms_norm on the cpu backend called once per row count."""
    backend = get_backend("cpu")
    with recording_calls(backend) as recorder:
        ops = OpDispatcher(backend)
        for rows in row_counts:
            ops.rms_norm(torch.randn(rows, 8), torch.ones(8), eps=1e-6)
    return recorder


def test_a_recorded_call_becomes_a_case_with_the_same_inputs() -> None:
    backend = get_backend("cpu")
    x = torch.randn(3, 8)
    with recording_calls(backend) as recorder:
        OpDispatcher(backend).rms_norm(x, torch.ones(8), eps=1e-6)
    (case,) = recorder.cases()["rms_norm"]
    assert torch.equal(case.args["x"], x) and case.args["eps"] == 1e-6
    assert case.name == "recorded x=[3, 8] weight=[8]"


def test_only_the_first_few_shapes_of_a_signature_are_kept() -> None:
    recorder = rms_norm_rows(*range(1, MAX_SHAPES_PER_SIGNATURE + 3))
    assert len(recorder.cases()["rms_norm"]) == MAX_SHAPES_PER_SIGNATURE


def test_a_repeated_shape_is_kept_once() -> None:
    assert len(rms_norm_rows(2, 2, 2).cases()["rms_norm"]) == 1


def test_an_oversized_call_is_counted_but_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recording, "MAX_RECORDED_BYTES", 16)
    recorder = rms_norm_rows(4)
    assert (recorder.too_large, recorder.cases(), recorder.ops_called) == (1, {}, ["rms_norm"])


def test_the_backend_hands_out_its_own_kernels_again_afterwards() -> None:
    backend = get_backend("cpu")
    with recording_calls(backend):
        assert backend.kernel_for("rms_norm") is not get_backend("cpu").kernels().get("rms_norm")
    assert backend.kernel_for("rms_norm") is backend.kernels().get("rms_norm")
