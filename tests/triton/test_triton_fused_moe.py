"""The Triton fused MoE matches the reference: bf16/fp16/fp32 weights, fp8 weights with
128x128 block scales in both flavours, an expert map with experts on other ranks, and
index tensors of mixed widths."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES

TOKENS, HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 5, 32, 24, 4, 2


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _routing(ids_dtype: torch.dtype, experts: int = EXPERTS) -> tuple[torch.Tensor, torch.Tensor]:
    weights = _randn(TOKENS, TOP_K, seed=5).softmax(dim=-1)
    ids = torch.stack(
        [torch.randperm(experts, generator=torch.Generator().manual_seed(t))[:TOP_K] for t in range(TOKENS)]
    )
    return weights, ids.to(ids_dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("ids_dtype", INDEX_DTYPES)
def test_fused_moe_matches_reference(assert_matches_reference, dtype, ids_dtype):
    hidden = _randn(TOKENS, HIDDEN).to(dtype)
    w13 = (_randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, seed=1) * 0.2).to(dtype)
    w2 = (_randn(EXPERTS, HIDDEN, INTERMEDIATE, seed=2) * 0.2).to(dtype)
    assert_matches_reference("fused_moe", hidden, w13, w2, *_routing(ids_dtype))


@pytest.mark.parametrize("ids_dtype, map_dtype", [(torch.int64, torch.int32), (torch.int32, torch.int64)])
def test_fused_moe_skips_experts_mapped_to_other_ranks(assert_matches_reference, ids_dtype, map_dtype):
    # Six global experts, this rank holds global 1, 4 and 5 as local 0, 1 and 2.
    expert_map = torch.tensor([-1, 0, -1, -1, 1, 2], dtype=map_dtype)
    hidden = _randn(TOKENS, HIDDEN).to(torch.bfloat16)
    w13 = (_randn(3, 2 * INTERMEDIATE, HIDDEN, seed=1) * 0.2).to(torch.bfloat16)
    w2 = (_randn(3, HIDDEN, INTERMEDIATE, seed=2) * 0.2).to(torch.bfloat16)
    assert_matches_reference("fused_moe", hidden, w13, w2, *_routing(ids_dtype, experts=6), expert_map)


def test_fused_moe_gives_zero_for_a_token_whose_experts_are_all_elsewhere(triton_ops):
    weights, ids = _routing(torch.int32)
    expert_map = torch.full((EXPERTS,), -1, dtype=torch.int32)
    expert_map[ids[1:].unique().long()] = torch.arange(ids[1:].unique().numel(), dtype=torch.int32)
    expert_map[ids[0].long()] = -1
    w13 = _randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN, seed=1)
    out = triton_ops.fused_moe(_randn(TOKENS, HIDDEN), w13, _randn(EXPERTS, HIDDEN, INTERMEDIATE), weights, ids, expert_map)
    assert torch.equal(out[0], torch.zeros(HIDDEN))


def _block_quantised(weight: torch.Tensor, fp8_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """An fp8 weight [E, rows, cols] and its 128x128 block scales."""
    experts, rows, cols = weight.shape
    scales = _randn(experts, -(-rows // 128), -(-cols // 128), seed=9).abs() * 0.01 + 0.005
    return weight.to(fp8_dtype), scales


@pytest.mark.parametrize("fp8_dtype", FP8_DTYPES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_fused_moe_dequantises_fp8_weights_by_their_block_scales(assert_matches_reference, dtype, fp8_dtype):
    # 2I = 288 and H = 160 span partial 128x128 blocks in both directions.
    intermediate, hidden_size = 144, 160
    w13, w13_scale = _block_quantised(_randn(EXPERTS, 2 * intermediate, hidden_size, seed=1) * 8, fp8_dtype)
    w2, w2_scale = _block_quantised(_randn(EXPERTS, hidden_size, intermediate, seed=2) * 8, fp8_dtype)
    hidden = _randn(TOKENS, hidden_size).to(dtype)
    assert_matches_reference(
        "fused_moe", hidden, w13, w2, *_routing(torch.int64), None, w13_scale, w2_scale
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "dtype, fp8_dtype, swiglu_limit",
    [(torch.bfloat16, torch.float8_e4m3fn, 0.0), (torch.float16, torch.float8_e4m3fnuz, 4.0)],
)
def test_fused_moe_fp8_dot_path_meets_the_gpu_backends_declared_bound(
    triton_ops, reference_ops, nmse_of, dtype, fp8_dtype, swiglu_limit
):
    # The GPU path (activations quantised per 128-wide group, fp8 dots, scales on the
    # accumulator), forced under the interpreter; two of six global experts elsewhere.
    from accord.backends.triton.gpu_backend import FP8_DOT_MOE_NMSE
    from accord.backends.triton.kernels.fused_moe import Fp8Path, run_fused_moe

    intermediate, hidden_size = 144, 160
    w13, w13_scale = _block_quantised(_randn(4, 2 * intermediate, hidden_size, seed=1) * 8, fp8_dtype)
    w2, w2_scale = _block_quantised(_randn(4, hidden_size, intermediate, seed=2) * 8, fp8_dtype)
    expert_map = torch.tensor([0, -1, 1, 2, -1, 3], dtype=torch.int32)
    hidden = _randn(TOKENS, hidden_size).to(dtype)
    args = (hidden, w13, w2, *_routing(torch.int64, experts=6), expert_map, w13_scale, w2_scale)
    want = reference_ops.fused_moe(*args, swiglu_limit=swiglu_limit)
    outputs = {}
    for path in (Fp8Path.FP8_DOTS, Fp8Path.DEQUANTISED):
        outputs[path] = torch.empty_like(want)
        run_fused_moe(*args, swiglu_limit, outputs[path], path)
    assert nmse_of(outputs[Fp8Path.FP8_DOTS], want) <= FP8_DOT_MOE_NMSE
    # The quantisation really ran: the fp8-dot path is measurably off the exact one.
    assert nmse_of(outputs[Fp8Path.FP8_DOTS], want) > 100 * nmse_of(outputs[Fp8Path.DEQUANTISED], want)


def test_fp8_weights_take_the_exact_path_under_the_interpreter_and_fp8_dots_on_gpus(triton_ops):
    from accord.backends import default_registry
    from accord.backends.triton.kernels.fused_moe import Fp8Path, fp8_path

    assert fp8_path(torch.bfloat16, torch.bfloat16) is Fp8Path.UNQUANTISED
    assert fp8_path(torch.float8_e4m3fn, torch.bfloat16) is Fp8Path.DEQUANTISED
    assert fp8_path(torch.float8_e4m3fn, torch.bfloat16, fp8_dots=True) is Fp8Path.FP8_DOTS
    # The interpreter is held to the contract's own bounds; the GPU backends widen only
    # fp8 weights with half activations (the fp8-dot path), never half weights.
    fp8_call = {"hidden": torch.bfloat16, "w13": torch.float8_e4m3fn, "w2": torch.float8_e4m3fn}
    assert triton_ops.backend.tolerance_override("fused_moe", fp8_call) is None
    cuda = default_registry().get("cuda", require_available=False)
    assert cuda.tolerance_override("fused_moe", fp8_call) is not None
    assert cuda.tolerance_override("fused_moe", {**fp8_call, "hidden": torch.float32}) is None
    assert cuda.tolerance_override("fused_moe", {**fp8_call, "w13": torch.bfloat16, "w2": torch.bfloat16}) is None


def test_every_gpu_tile_config_keeps_one_scale_block_per_k_tile():
    from accord.backends.triton.kernels import fused_moe

    for config in fused_moe._GPU_CONFIGS:
        assert fused_moe.WEIGHT_BLOCK % config.kwargs["BLOCK_K"] == 0, config
        assert config.kwargs["BLOCK_N"] >= 16 and config.kwargs["BLOCK_K"] >= 32, config  # fp8 tl.dot minimums


@pytest.mark.parametrize("slots, experts, expected", [(2, 8, 16), (8 * 40, 8, 64), (8 * 20, 8, 32), (4096, 8, 64)])
def test_row_block_height_follows_the_rows_per_expert(slots, experts, expected):
    from accord.backends.triton.kernels.fused_moe import block_m_for

    assert block_m_for(slots, experts, interpreter=False) == expected
    assert block_m_for(slots, experts, interpreter=True) == 16
