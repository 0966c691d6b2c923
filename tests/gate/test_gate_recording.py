"""Recording the op calls an engine makes: each new signature's inputs are copied into
a conformance case, a few shapes per signature at most, oversized calls only counted,
and the backend is left as it was."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.gate import recording
from accord.gate.recording import MAX_SHAPES_PER_SIGNATURE, recording_calls
from accord.conformance import ConformanceRunner, Status
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


def _record_paged_calls(num_blocks: int) -> tuple[recording.CallRecorder, dict]:
    """reshape_and_cache and paged_attention on the cpu backend over a cache of
    `num_blocks` blocks, two sequences placed in far-apart blocks."""
    backend = get_backend("cpu")
    block, heads, dim = 16, 2, 8
    cache = torch.zeros(num_blocks, block, heads, dim)
    tables = torch.tensor([[num_blocks - 1, 7], [3, 0]], dtype=torch.int32)  # seq 1 uses one block
    seq_lens = torch.tensor([block + 1, 5], dtype=torch.int32)
    slots = torch.tensor([7 * block, -1, 3 * block + 4], dtype=torch.int64)
    with recording_calls(backend) as recorder:
        ops = OpDispatcher(backend)
        kv = torch.randn(3, heads, dim)
        ops.reshape_and_cache(kv, kv, cache, cache.clone(), slots)
        ops.paged_attention(torch.randn(2, 4, dim), cache, cache.clone(), tables, seq_lens,
                            torch.tensor([0, 1, 2], dtype=torch.int32), scale=dim**-0.5)
    return recorder, {"tables": tables, "slots": slots, "block": block}


def test_a_paged_call_is_replayed_on_a_few_generated_blocks_not_the_production_cache() -> None:
    recorder, _ = _record_paged_calls(num_blocks=4096)
    # Only the small tensors were copied: the two 4096-block caches (4 MiB each) were not.
    assert recorder.recorded_bytes < 4096
    (attention,) = recorder.cases()["paged_attention"]
    # Blocks reached: 4095 and 7 (sequence 0), 3 (sequence 1); plus the spare.
    assert attention.args["key_cache"].shape == (4, 16, 2, 8)
    assert attention.args["block_tables"].tolist() == [[0, 1], [2, 3]]
    assert attention.args["block_tables"].dtype == torch.int32
    (cache,) = recorder.cases()["reshape_and_cache"]
    assert cache.args["key_cache"].shape == (3, 16, 2, 8)
    assert cache.args["slot_mapping"].tolist() == [0, -1, 16 + 4]
    assert cache.args["slot_mapping"].dtype == torch.int64


def test_replayed_paged_cases_pass_conformance_on_the_cpu_backend() -> None:
    recorder, _ = _record_paged_calls(num_blocks=64)
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"))
    results = [runner.run_case(case) for cases in recorder.cases().values() for case in cases]
    assert [r.status for r in results] == [Status.PASS] * 2, [r.message for r in results]


def test_a_replayed_case_is_the_same_for_the_same_seed() -> None:
    first, second = (_record_paged_calls(64)[0].cases()["paged_attention"][0] for _ in range(2))
    assert torch.equal(first.args["key_cache"], second.args["key_cache"])
