"""Each class of kernel bug the suite used to let through, as a deliberately broken
double: it fails the cases added for it (and only where the bug shows), while the
real cpu backend passes them."""

from __future__ import annotations

from typing import Any, Callable

import pytest
from conformance_doubles import (
    compressed_attention_reading_minus_one_as_entry_0,
    fused_moe_clipping_only_float_weights_under_a_map,
    indexer_ties_to_the_higher_entry,
    kv_compress_reading_a_window_from_one_block,
    kv_compress_taking_the_previous_rows_window,
    linear_dropping_the_k_remainder,
    linear_guessing_the_weight_orientation,
    linear_with_a_half_running_sum,
    quantize_rounding_toward_zero,
    route_biasing_only_sigmoid,
    route_exponentiating_without_the_max,
    attention_dropping_the_block_edge_key,
    attention_with_default_scale,
    attention_with_k_scale_for_values,
    broken,
    cache_store_without_saturation,
    fused_moe_with_bf16_dequantised_weights,
    quantize_with_half_precision_scales,
    quantize_without_amax_floor,
    rms_norm_in_the_input_dtype,
    rms_norm_with_fixed_eps,
    route_scaling_only_when_renormalising,
    sampler,
    scaled_mm_reusing_the_last_full_k_scale,
    scaled_mm_with_a_bf16_accumulator,
    rotary_with_the_table_in_the_query_dtype,
)

from accord.backends import Backend, get_backend
from accord.conformance import CaseResult, ConformanceRunner, Status, cases_for

Selector = Callable[[CaseResult], bool]


def results_of(backend: Backend, op: str, wanted: Selector) -> list[CaseResult]:
    """The legal cases of `op` that `wanted` selects, run on `backend`."""
    runner = ConformanceRunner(backend, get_backend("reference"))
    results = []
    for case in cases_for(op):
        if case.expect_refusal:
            continue
        probe = CaseResult(op, case.name, case.combo, Status.PASS)
        if wanted(probe):
            results.append(runner.run_case(case))
    return results


def statuses(results: list[CaseResult]) -> set[Status]:
    return {r.status for r in results}


#: (op, bug, the cases that must catch it, other cases of the op it must pass; None
#: where the bug shows in every case).
GAPS: dict[str, tuple[str, Any, Selector, Selector | None]] = {
    "attention ignoring the scale argument": (
        "paged_attention", attention_with_default_scale,
        lambda r: "scale x" in r.case, lambda r: r.case == "mixed"),
    "attention dequantising values with k_scale": (
        "paged_attention", attention_with_k_scale_for_values,
        lambda r: "fp8" in r.combo and r.case == "mixed", lambda r: "fp8" not in r.combo and r.case == "mixed"),
    "prefill losing a block-edge key": (
        "paged_attention", attention_dropping_the_block_edge_key,
        lambda r: r.case == "prefill on block edge", lambda r: r.case == "mixed"),
    "fp8 cache store without saturation": (
        "reshape_and_cache", cache_store_without_saturation,
        lambda r: "beyond fp8 range" in r.case, lambda r: "fp8" in r.combo and r.case == "T=16 BS=16"),
    "rms_norm with a hard-coded eps": (
        "rms_norm", rms_norm_with_fixed_eps, lambda r: "mean square ~ eps" in r.case, lambda r: "H=96" in r.case),
    "quantize_fp8 without the amax floor": (
        "quantize_fp8", quantize_without_amax_floor,
        lambda r: "zero rows" in r.case and "static" not in r.case, lambda r: "T=5 H=200" in r.case),
    "scaled_mm misscaling a partial last K group": (
        "scaled_mm", scaled_mm_reusing_the_last_full_k_scale,
        lambda r: r.case.startswith("block") and "K=200" in r.case and "fp32" in r.combo,
        lambda r: r.case.startswith("block") and "K=256" in r.case and "fp32" in r.combo),
    "routed scaling only when renormalising": (
        "moe_route", route_scaling_only_when_renormalising,
        lambda r: "renorm=False scale=2.5" in r.case, lambda r: "scale=1 " in r.case or r.case.endswith("scale=1")),
    "greedy ties won by the last index": (
        "sample", sampler(greedy_last=True), lambda r: r.case == "greedy tied maxima", lambda r: r.case.startswith("B=")),
    "temperature applied after the filters": (
        "sample", sampler(temperature_last=True),
        lambda r: "seeds T=" in r.case and "top_p=1.0" not in r.case or "min_p=0.2" in r.case,
        lambda r: r.case.startswith("B=1 ")),
    "top-p dropping its boundary token": (
        "sample", sampler(top_p_drops_boundary=True),
        lambda r: "seeds T=0.5" in r.case, lambda r: r.case.startswith("B=1 ")),
    "top-p keeping one token past the boundary": (
        "sample", sampler(top_p_keeps_one_more=True),
        lambda r: "seeds" in r.case and "top_p=1.0" not in r.case, lambda r: "top_p=1.0" in r.case),
    "top-k keeping one token too many": (
        "sample", sampler(top_k_shift=1),
        lambda r: "seeds" in r.case and "top_k=0" not in r.case, lambda r: "top_k=0" in r.case),
    "top-k keeping one token too few": (
        "sample", sampler(top_k_shift=-1),
        lambda r: "seeds" in r.case and "top_k=0" not in r.case, lambda r: "top_k=0" in r.case),
    # Tolerances: ops rounded once are judged in ulps, fp8 GEMMs at fp32 accumulation.
    "rms_norm computed in the input dtype": (
        "rms_norm", rms_norm_in_the_input_dtype,
        lambda r: "=bf16" in r.combo and "H=96" in r.case, lambda r: "=fp32" in r.combo),
    "rotary reading its table in the query dtype": (
        "rotary_embedding", rotary_with_the_table_in_the_query_dtype,
        lambda r: "=bf16" in r.combo, lambda r: "=fp32" in r.combo),
    "quantize_fp8 with half-precision scales": (
        "quantize_fp8", quantize_with_half_precision_scales,
        lambda r: "x=bf16" in r.combo and "static" not in r.case and "T=5" in r.case,
        lambda r: "x=fp32" in r.combo or "static" in r.case),
    "scaled_mm with a bf16 accumulator": (
        "scaled_mm", scaled_mm_with_a_bf16_accumulator,
        lambda r: r.case.startswith(("tensor", "block")) and "M=5" in r.case and "bias" not in r.combo, None),
    "fused_moe with fp8 weights dequantised to bf16": (
        "fused_moe", fused_moe_with_bf16_dequantised_weights,
        lambda r: "fp8" in r.combo and "T=6" in r.case and "v4" not in r.case,
        lambda r: "fp8" not in r.combo and "T=6 E=4 local ids" == r.case),
    # Issue 32's escape classes, one double each (class number first).
    "1 linear guessing the weight's orientation from its shape": (
        "linear", linear_guessing_the_weight_orientation,
        lambda r: "K=64 N=64" in r.case, lambda r: r.case.startswith("T=7 K=96 N=80")),
    "1 linear dropping the K remainder past a full block": (
        "linear", linear_dropping_the_k_remainder,
        lambda r: "K=200" in r.case, lambda r: r.case.startswith("T=7 K=96 N=80")),
    "1 linear carrying a half-precision running sum": (
        "linear", linear_with_a_half_running_sum,
        lambda r: r.case == "T=3 K=2880 N=40" and "fp32" not in r.combo,
        lambda r: r.case == "T=3 K=2880 N=40" and "out_dtype=fp32" in r.combo),
    "2 kv_compress reading a window from its first block": (
        "kv_compress", kv_compress_reading_a_window_from_one_block,
        lambda r: "spanning blocks" in r.case, lambda r: " all " in r.case),
    "2 kv_compress taking the previous row's window as predecessor": (
        "kv_compress", kv_compress_taking_the_previous_rows_window,
        lambda r: r.case.startswith("csa decode"), lambda r: r.case.startswith("csa all")),
    "3 indexer_topk breaking ties toward the higher entry": (
        "indexer_topk", indexer_ties_to_the_higher_entry,
        lambda r: "tied" in r.case, lambda r: r.case == "mixed top_k=16"),
    "4 compressed_attention reading -1 as entry 0": (
        "compressed_attention", compressed_attention_reading_minus_one_as_entry_0,
        lambda r: "partial picks" in r.case, lambda r: r.case in ("mixed csa", "mixed csa sinks")),
    "5 fused_moe clipping only float weights under an expert map": (
        "fused_moe", fused_moe_clipping_only_float_weights_under_a_map,
        lambda r: "swiglu_limit" in r.case and ("fp8" in r.combo or "local ids" in r.case),
        lambda r: "swiglu_limit" in r.case and "expert map" in r.case and "fp8" not in r.combo),
    "6 moe_route biasing only sigmoid scores": (
        "moe_route", route_biasing_only_sigmoid,
        lambda r: r.case.startswith("sqrt_softplus") and "+bias" in r.case,
        lambda r: r.case.startswith("sigmoid") and "+bias" in r.case),
    "6 moe_route exponentiating without the max": (
        "moe_route", route_exponentiating_without_the_max,
        lambda r: "wide logits" in r.case, lambda r: r.case.startswith("softmax renorm=True scale=1 T=9")),
    "7 top-k cutting a tie at the k-th token": (
        "sample", sampler(top_k_drops_ties=True),
        lambda r: "tied at the k-th" in r.case, lambda r: r.case.startswith("B=")),
    "7 top-p judged before top-k's renormalisation": (
        "sample", sampler(top_p_before_top_k=True),
        lambda r: "top_k=3 top_p=0.7" in r.case, lambda r: "top_k=0" in r.case),
    "8 quantize_fp8 rounding toward zero": (
        "quantize_fp8", quantize_rounding_toward_zero, lambda r: "T=5 H=200" in r.case, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("gap", GAPS)
def test_the_broken_double_fails_the_new_cases_and_only_those(gap: str) -> None:
    op, bug, catching, unaffected = GAPS[gap]
    double = broken(gap, op, bug)
    caught = results_of(double, op, catching)
    assert caught and Status.FAIL in statuses(caught), [r.message for r in caught]
    if unaffected is None:
        return
    spared = results_of(double, op, unaffected)
    assert spared and statuses(spared) == {Status.PASS}, [r.message for r in spared if r.status is Status.FAIL]


@pytest.mark.slow
@pytest.mark.parametrize("gap", GAPS)
def test_the_cpu_backend_passes_the_new_cases(gap: str) -> None:
    op, _bug, catching, _unaffected = GAPS[gap]
    results = results_of(get_backend("cpu"), op, catching)
    assert results and Status.FAIL not in statuses(results), [r.message for r in results if r.status is Status.FAIL]


#: The sampler bugs, and what the draws check must say about their many-seed cases
#: (besides the exact token ids): a token outside the filters, or a misfit.
DRAW_BUGS = {
    "temperature applied after the filters": "seeds T=0.5",
    "top-p dropping its boundary token": "seeds T=1.0 top_k=0 top_p=0.9",
    "top-p keeping one token past the boundary": "seeds T=1.0 top_k=0 top_p=0.9",
    "top-k keeping one token too many": "seeds T=1.0 top_k=5",
    "top-k keeping one token too few": "seeds T=1.0 top_k=5",
}


@pytest.mark.slow
@pytest.mark.parametrize("gap", DRAW_BUGS)
def test_the_draws_check_names_the_misfit_of_each_sampler_bug(gap: str) -> None:
    op, bug, _catching, _unaffected = GAPS[gap]
    results = results_of(broken(gap, op, bug), op, lambda r: DRAW_BUGS[gap] in r.case and "tied" not in r.case)
    assert results and all(r.status is Status.FAIL for r in results)
    assert all("which its filters exclude" in r.message or "chi-square" in r.message for r in results), [
        r.message for r in results
    ]


def test_the_reference_draws_fit_their_own_distribution_in_every_many_seed_case() -> None:
    results = results_of(get_backend("cpu"), "sample", lambda r: "seeds" in r.case)
    assert len(results) == 9 and statuses(results) == {Status.PASS}, [r.message for r in results]


@pytest.mark.parametrize("op", ("quantize_fp8", "moe_route"))
def test_the_cpu_kernels_once_shared_with_the_reference_pass_as_independent(op: str) -> None:
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"))
    assert not runner.shares_reference_kernel(op)
    legal = [runner.run_case(case) for case in cases_for(op) if not case.expect_refusal]
    assert legal and statuses(legal) == {Status.PASS}, [r.message for r in legal if r.status is not Status.PASS]


@pytest.mark.slow
def test_collectives_catch_an_fp32_reduction_summed_in_bf16_while_gloo_passes() -> None:
    """Class 9: full-mantissa inputs, so a reduction carried in bf16 differs from the
    fp64 sum rounded once (the exact two-rank result); the real gloo ranks match it."""
    from conformance_doubles import fp32_reductions_real_and_bf16_summing

    from accord.conformance.ranks import spawn_ranks

    per_rank = spawn_ranks(fp32_reductions_real_and_bf16_summing, 0, backend_name="cpu", world_size=2)
    real = [r for rank in per_rank for r in rank["real"]]
    summed_in_bf16 = [r for rank in per_rank for r in rank["bf16 sums"]]
    assert real and {r.status for r in real} == {"passed"}, [r.detail for r in real]
    even = [r for r in summed_in_bf16 if r.case.endswith(",even]")]
    assert even and {r.status for r in even} == {"failed"}, [(r.case, r.status) for r in even]
