"""Recording the op calls an engine makes, through a dispatcher hook: each new
signature's inputs are copied into a conformance case, a few shapes per signature at
most, oversized calls only counted; the hook sees only its own dispatcher, calls whose
kernel crashes are still recorded (on disk too), other dispatchers keep their kernels
and fast paths, and a worker records when its config asks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from accord.backends import get_backend
from accord.conformance import ConformanceRunner, Status
from accord.gate.recording import recorded_cases
from accord.op_contracts import Kernel, OpDispatcher
from accord.op_contracts import recording
from accord.op_contracts.recording import MAX_SHAPES_PER_SIGNATURE, CallRecorder, rank_directory, read_recordings


def recording_dispatcher(directory: Path | None = None) -> tuple[OpDispatcher, CallRecorder]:
    """A cpu dispatcher with a recorder hooked in."""
    ops, recorder = OpDispatcher(get_backend("cpu")), CallRecorder(directory)
    ops.add_hook(recorder)
    return ops, recorder


def rms_norm_rows(*row_counts: int) -> CallRecorder:
    """Record rms_norm on the cpu backend called once per row count."""
    ops, recorder = recording_dispatcher()
    for rows in row_counts:
        ops.rms_norm(torch.randn(rows, 8), torch.ones(8), eps=1e-6)
    return recorder


def test_a_recorded_call_becomes_a_case_with_the_same_inputs() -> None:
    ops, recorder = recording_dispatcher()
    x = torch.randn(3, 8)
    ops.rms_norm(x, torch.ones(8), eps=1e-6)
    (case,) = recorded_cases({0: recorder.calls}).cases["rms_norm"]
    assert torch.equal(case.args["x"], x) and case.args["eps"] == 1e-6
    assert case.name == "recorded x=[3, 8] weight=[8] eps=1e-06"


def test_only_the_first_few_shapes_of_a_signature_are_kept() -> None:
    recorder = rms_norm_rows(*range(1, MAX_SHAPES_PER_SIGNATURE + 3))
    assert len(recorder.calls) == MAX_SHAPES_PER_SIGNATURE


def test_a_repeated_shape_is_kept_once() -> None:
    assert len(rms_norm_rows(2, 2, 2).calls) == 1


def test_an_oversized_call_is_counted_but_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recording, "MAX_RECORDED_BYTES", 16)
    recorder = rms_norm_rows(4)
    replay = recorded_cases({0: recorder.calls})
    assert (recorder.too_large, replay.too_large, replay.cases, replay.ops_called) == (1, 1, {}, ["rms_norm"])


def test_the_hook_sees_only_its_own_dispatcher_and_leaves_kernels_alone() -> None:
    backend = get_backend("cpu")
    hooked, recorder = recording_dispatcher()
    other = OpDispatcher(backend)
    hooked.rms_norm(torch.randn(2, 8), torch.ones(8), eps=1e-6)
    other.silu_and_mul(torch.randn(2, 16))
    assert recorder.ops_called == ["rms_norm"]
    assert backend.kernel_for("rms_norm") is backend.kernels().get("rms_norm")


def test_without_a_hook_calls_take_the_fast_path_and_with_one_they_do_not() -> None:
    ops, recorder = recording_dispatcher()
    x, w = torch.randn(2, 8), torch.ones(8)
    ops.rms_norm(x, w, 1e-6)
    ops.rms_norm(x, w, 1e-6)
    assert ops.rms_norm.fast_paths == 0
    ops.remove_hook(recorder)
    ops.rms_norm(x, w, 1e-6)
    ops.rms_norm(torch.randn(5, 8), w, 1e-6)
    assert ops.rms_norm.fast_paths == 1
    assert len(recorder.calls) == 1  # removed: later calls unseen


class CrashingBackend:
    """The cpu backend's kernels, but rms_norm raises (a kernel that kills its step)."""

    name, device_type = "crashing", "cpu"

    def kernel_for(self, op: str) -> Kernel | None:
        kernel = get_backend("cpu").kernel_for(op)
        if op != "rms_norm" or kernel is None:
            return kernel

        def crash(**call: object) -> None:
            raise RuntimeError("illegal memory access")

        return Kernel(op, crash)


def test_a_call_whose_kernel_crashes_is_on_disk_before_the_crash(tmp_path: Path) -> None:
    ops = OpDispatcher(CrashingBackend())
    ops.add_hook(CallRecorder(rank_directory(tmp_path, 1)))
    x = torch.randn(4, 8, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        ops.rms_norm(x, torch.ones(8, dtype=torch.bfloat16), eps=1e-5)
    (call,) = read_recordings(tmp_path)[1]
    assert call.op == "rms_norm" and torch.equal(call.args["x"], x) and call.args["eps"] == 1e-5


def test_each_rank_s_signatures_are_reported_and_a_shared_one_is_replayed_once(tmp_path: Path) -> None:
    """Two ranks record into one folder: a call both made alike is one case naming both
    ranks; a slot_mapping width only rank 1 used is a case of its own, named for rank 1."""
    for rank, slots_dtype in ((0, torch.int32), (1, torch.int64)):
        ops, _ = recording_dispatcher(rank_directory(tmp_path, rank))
        ops.rms_norm(torch.ones(2, 8), torch.ones(8), eps=1e-6)
        cache, kv = torch.zeros(4, 16, 2, 8), torch.randn(2, 2, 8)
        ops.reshape_and_cache(kv, kv, cache, cache.clone(), torch.tensor([1, 20], dtype=slots_dtype))
    replay = recorded_cases(read_recordings(tmp_path))
    (norm,) = replay.cases["rms_norm"]
    assert norm.name.endswith("on ranks 0,1")
    caches = replay.cases["reshape_and_cache"]
    assert sorted((str(case.args["slot_mapping"].dtype), case.name.rsplit(" ", 2)[-2:]) for case in caches) == [
        ("torch.int32", ["rank", "0"]), ("torch.int64", ["rank", "1"])]
    per_rank = {(s.rank, s.op, s.case) for s in replay.signatures}
    assert {(0, "rms_norm", norm.name), (1, "rms_norm", norm.name)} <= per_rank
    assert [s.rank for s in replay.signatures if s.op == "reshape_and_cache"] == [0, 1]


def _record_paged_calls(num_blocks: int) -> tuple[CallRecorder, dict]:
    """reshape_and_cache and paged_attention on the cpu backend over a cache of
    `num_blocks` blocks, two sequences placed in far-apart blocks."""
    block, heads, dim = 16, 2, 8
    cache = torch.zeros(num_blocks, block, heads, dim)
    tables = torch.tensor([[num_blocks - 1, 7], [3, 0]], dtype=torch.int32)  # seq 1 uses one block
    seq_lens = torch.tensor([block + 1, 5], dtype=torch.int32)
    slots = torch.tensor([7 * block, -1, 3 * block + 4], dtype=torch.int64)
    ops, recorder = recording_dispatcher()
    kv = torch.randn(3, heads, dim)
    ops.reshape_and_cache(kv, kv, cache, cache.clone(), slots)
    ops.paged_attention(torch.randn(2, 4, dim), cache, cache.clone(), tables, seq_lens,
                        torch.tensor([0, 1, 2], dtype=torch.int32), scale=dim**-0.5)
    return recorder, {"tables": tables, "slots": slots, "block": block}


def test_a_paged_call_is_replayed_on_a_few_generated_blocks_not_the_production_cache() -> None:
    recorder, _ = _record_paged_calls(num_blocks=4096)
    # Only the small tensors were copied: the two 4096-block caches (4 MiB each) were not.
    assert recorder.recorded_bytes < 4096
    cases = recorded_cases({0: recorder.calls}).cases
    (attention,) = cases["paged_attention"]
    # Blocks reached: 4095 and 7 (sequence 0), 3 (sequence 1); plus the spare.
    assert attention.args["key_cache"].shape == (4, 16, 2, 8)
    assert attention.args["block_tables"].tolist() == [[0, 1], [2, 3]]
    assert attention.args["block_tables"].dtype == torch.int32
    (cache,) = cases["reshape_and_cache"]
    assert cache.args["key_cache"].shape == (3, 16, 2, 8)
    assert cache.args["slot_mapping"].tolist() == [0, -1, 16 + 4]
    assert cache.args["slot_mapping"].dtype == torch.int64


def test_a_paged_call_read_back_from_disk_replays_like_the_one_in_memory(tmp_path: Path) -> None:
    ops, recorder = recording_dispatcher(rank_directory(tmp_path, 0))
    cache = torch.zeros(8, 16, 2, 8)
    kv = torch.randn(3, 2, 8)
    ops.reshape_and_cache(kv, kv, cache, cache.clone(), torch.tensor([0, 17, 40]))
    (in_memory,), (on_disk,) = (recorded_cases({0: calls}).cases["reshape_and_cache"]
                                for calls in (recorder.calls, read_recordings(tmp_path)[0]))
    assert on_disk.name == in_memory.name
    for name, value in in_memory.args.items():
        assert torch.equal(on_disk.args[name], value) if isinstance(value, torch.Tensor) else on_disk.args[name] == value


def test_replayed_paged_cases_pass_conformance_on_the_cpu_backend() -> None:
    recorder, _ = _record_paged_calls(num_blocks=64)
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"))
    results = [runner.run_case(case) for cases in recorded_cases({0: recorder.calls}).cases.values() for case in cases]
    assert [r.status for r in results] == [Status.PASS] * 2, [r.message for r in results]


def test_a_replayed_case_is_the_same_for_the_same_seed() -> None:
    first, second = (recorded_cases({0: _record_paged_calls(64)[0].calls}).cases["paged_attention"][0]
                     for _ in range(2))
    assert torch.equal(first.args["key_cache"], second.args["key_cache"])


def test_a_prepacked_weight_is_replayed_prepacked_at_the_recorded_row_counts(tmp_path: Path) -> None:
    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN: the cpu backend prepacks nothing")
    ops, recorder = recording_dispatcher(rank_directory(tmp_path, 0))
    # A bf16 checkpoint's weight computed in fp32: one row takes the cpu backend's
    # few-rows path where it has one, six its many-rows path.
    weight = (torch.randn(40, 64) / 8).bfloat16().float()
    prepared = ops.prepare_linear_weight(weight)
    for rows in (1, 6):
        ops.linear(torch.randn(rows, 64), prepared)
    assert [call.prepared for call in recorder.calls] == [("weight",)] * 2
    cases = recorded_cases(read_recordings(tmp_path)).cases["linear"]
    assert [case.prepared for case in cases] == [("weight",)] * 2
    assert all(torch.equal(case.args["weight"], weight) for case in cases)
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"))
    assert [runner.run_case(case).status for case in cases] == [Status.PASS] * 2
