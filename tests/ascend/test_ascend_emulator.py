"""The operator emulator refuses what torch-npu's documentation says each operator
refuses (dtype sets, index widths, value ranges, layouts), and computes what it says
each computes, checked against formulas written here."""

from __future__ import annotations

import pytest
import torch

from accord.backends.ascend import emulator
from accord.backends.ascend.emulator import NpuOperatorError
from accord.backends.ascend.kernels import moe as moe_kernels
from accord.op_contracts import ContractError, OpDispatcher


def _routing_inputs(ids_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(3, 8)
    expert_idx = torch.tensor([[0, 2], [1, 2], [3, 0]], dtype=ids_dtype)
    row_idx = torch.arange(6, dtype=torch.int32).view(2, 3).t().contiguous()
    return x, row_idx, expert_idx


def test_int64_expert_ids_are_refused_by_init_routing():
    x, row_idx, expert_idx = _routing_inputs(torch.int64)
    with pytest.raises(NpuOperatorError, match=r"npu_moe_init_routing: expert_idx must be int32, got int64"):
        emulator.npu_moe_init_routing(x, row_idx, expert_idx, 3)


def test_int64_expert_ids_are_refused_by_finalize_routing():
    rows = torch.randn(6, 8)
    with pytest.raises(NpuOperatorError, match="expanded_src_to_dst_row must be int32"):
        emulator.npu_moe_finalize_routing(rows, None, None, None, torch.rand(3, 2), torch.arange(6), None)


def test_the_glue_without_its_declared_adapter_fails_in_the_emulator():
    """Calling the fused_moe kernel with int64 ids, bypassing the dispatcher's declared
    int32 adapter, is the motivating crash: the emulator stops it as the chip would."""
    hidden, w13, w2 = torch.randn(2, 16), torch.randn(4, 8, 16), torch.randn(4, 16, 4)
    ids = torch.tensor([[0, 1], [2, 3]], dtype=torch.int64)
    with pytest.raises(NpuOperatorError, match="expert_idx must be int32"):
        moe_kernels.fused_moe(emulator, hidden, w13, w2, torch.rand(2, 2), ids, None, None, None, "silu", 0.0,
                              torch.empty(2, 16))


def test_the_dispatcher_applies_the_declared_adapter_instead(emulated):
    ops = OpDispatcher(emulated, strict=True)
    hidden, w13, w2 = torch.randn(2, 16), torch.randn(4, 8, 16), torch.randn(4, 16, 4)
    out = ops.fused_moe(hidden, w13, w2, torch.rand(2, 2), torch.tensor([[0, 1], [2, 3]]))
    assert out.shape == (2, 16) and ops.adapter_counts["fused_moe.topk_ids"] == 1


def test_attention_refuses_int64_block_tables_and_fp32_queries():
    query, cache = torch.randn(1, 1, 2, 16, dtype=torch.bfloat16), torch.randn(2, 16, 32, dtype=torch.bfloat16)
    call = dict(actual_seq_lengths_kv=[5], num_heads=2, input_layout="BSND", num_key_value_heads=2, block_size=16)
    with pytest.raises(NpuOperatorError, match="block_table must be int32, got int64"):
        emulator.npu_fused_infer_attention_score(query, cache, cache, block_table=torch.zeros(1, 1, dtype=torch.int64), **call)
    with pytest.raises(NpuOperatorError, match="query must be float16/bfloat16, got float32"):
        emulator.npu_fused_infer_attention_score(query.float(), cache.float(), cache.float(),
                                                 block_table=torch.zeros(1, 1, dtype=torch.int32), **call)


def test_attention_refuses_block_sizes_off_the_16_grid():
    query, cache = torch.randn(1, 1, 2, 16, dtype=torch.float16), torch.randn(2, 8, 32, dtype=torch.float16)
    with pytest.raises(NpuOperatorError, match="block_size must be a multiple of 16"):
        emulator.npu_fused_infer_attention_score(
            query, cache, cache, block_table=torch.zeros(1, 1, dtype=torch.int32), actual_seq_lengths_kv=[5],
            num_heads=2, input_layout="BSND", num_key_value_heads=2, block_size=8)


def test_attention_matches_softmax_attention_over_the_visible_prefix():
    torch.manual_seed(0)
    heads, kv_heads, dim, block = 4, 2, 16, 16
    cache_k = torch.randn(3, block, kv_heads * dim, dtype=torch.bfloat16)
    cache_v = torch.randn(3, block, kv_heads * dim, dtype=torch.bfloat16)
    query = torch.randn(1, 1, heads, dim, dtype=torch.bfloat16)
    table, length, scale = torch.tensor([[2, 0]], dtype=torch.int32), 20, dim**-0.5
    out, _ = emulator.npu_fused_infer_attention_score(
        query, cache_k, cache_v, block_table=table, actual_seq_lengths_kv=[length], num_heads=heads, scale=scale,
        input_layout="BSND", num_key_value_heads=kv_heads, block_size=block)
    keys = cache_k[table[0].long()].reshape(-1, kv_heads, dim)[:length].double()
    values = cache_v[table[0].long()].reshape(-1, kv_heads, dim)[:length].double()
    for head in range(heads):
        kv = head // (heads // kv_heads)
        weights = torch.softmax(keys[:, kv] @ query[0, 0, head].double() * scale, dim=0)
        torch.testing.assert_close(out[0, 0, head].double(), weights @ values[:, kv], atol=1e-2, rtol=1e-2)


def test_cache_writer_refuses_padding_slots_and_mixed_dtypes():
    key = torch.randn(2, 1, 8, dtype=torch.float16)
    cache = torch.zeros(2, 16, 1, 8, dtype=torch.float16)
    with pytest.raises(NpuOperatorError, match=r"slot_mapping must be in \[0, 31\] \(no padding -1\)"):
        emulator.npu_scatter_pa_kv_cache(key, key, cache, cache.clone(), torch.tensor([3, -1]), cache_mode="Norm")
    with pytest.raises(NpuOperatorError, match="key_cache must be torch.float16 like key"):
        emulator.npu_scatter_pa_kv_cache(key, key, cache.float(), cache.clone(), torch.tensor([3, 4]), cache_mode="Norm")


def test_scatter_nd_update_has_no_fp8_on_a2():
    cache = torch.zeros(4, 8).to(torch.float8_e4m3fn)
    with pytest.raises(NpuOperatorError, match="npu_scatter_nd_update_: input must be"):
        emulator.npu_scatter_nd_update_(cache, torch.tensor([[1]]), torch.zeros(1, 8).to(torch.float8_e4m3fn))


def test_gating_top_k_refuses_small_groups_and_a_bias_of_another_dtype():
    x = torch.randn(3, 8)
    with pytest.raises(NpuOperatorError, match="group_count must be a divisor of 8 experts leaving more than 2"):
        emulator.npu_moe_gating_top_k(x, 2, k_group=2, group_count=4, norm_type=1)
    with pytest.raises(NpuOperatorError, match="bias must be torch.float32 like x"):
        emulator.npu_moe_gating_top_k(x, 2, bias=torch.zeros(8, dtype=torch.bfloat16), norm_type=1)


def test_gating_top_k_picks_within_the_best_groups():
    x = torch.tensor([[4.0, 3.0, 2.0, -5.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 5.0]])
    _, ids, norm = emulator.npu_moe_gating_top_k(x, 2, k_group=1, group_count=3, group_select_mode=1, norm_type=1,
                                                 out_flag=True)
    # Group sums of the top two sigmoids: group 0 (4, 3) beats group 2 (5, 0) and group 1.
    assert set(ids[0].tolist()) == {0, 1} and ids.dtype == torch.int32
    torch.testing.assert_close(norm, torch.sigmoid(x))


def test_grouped_matmul_takes_int64_group_lists_only():
    x, weight = torch.randn(4, 8), torch.randn(2, 8, 3)
    with pytest.raises(NpuOperatorError, match="group_list must be int64, got int32"):
        emulator.npu_grouped_matmul([x], [weight], group_list=torch.tensor([2, 4], dtype=torch.int32),
                                    split_item=2, group_type=0)
    (out,) = emulator.npu_grouped_matmul([x], [weight], group_list=torch.tensor([1, 4]), split_item=2, group_type=0)
    torch.testing.assert_close(out, torch.cat([x[:1] @ weight[0], x[1:] @ weight[1]]))


def test_rotary_mul_refuses_tables_of_another_dtype():
    x = torch.randn(1, 3, 2, 8, dtype=torch.bfloat16)
    with pytest.raises(NpuOperatorError, match="r1 must be torch.bfloat16 like input"):
        emulator.npu_rotary_mul(x, torch.ones(1, 3, 1, 8), torch.zeros(1, 3, 1, 8))


def test_rotary_mul_half_mode_rotates_pairs_half_a_head_apart():
    x = torch.randn(1, 2, 1, 4)
    angle = torch.tensor([0.3, 0.7])
    cos, sin = angle.cos().repeat(2)[None, None, None], angle.sin().repeat(2)[None, None, None]
    out = emulator.npu_rotary_mul(x, cos.expand(1, 2, 1, 4).contiguous(), sin.expand(1, 2, 1, 4).contiguous())
    a, b = x[..., :2], x[..., 2:]
    torch.testing.assert_close(out, torch.cat([a * angle.cos() - b * angle.sin(), b * angle.cos() + a * angle.sin()], -1))


def test_refusals_reach_conformance_as_contract_errors_not_crashes(emulated):
    """A shape the operator cannot take (sqrt-softplus with groups) is refused at the
    boundary with a ContractError naming the limit, before any operator runs."""
    ops = OpDispatcher(emulated, strict=True)
    with pytest.raises(ContractError, match="n_group expected 1 with sqrt_softplus"):
        ops.moe_route(torch.randn(2, 16), top_k=2, scoring="sqrt_softplus", n_group=4, topk_group=2)


def _paged_metadata(blocks: int) -> dict[str, torch.Tensor]:
    return {"block_tables": torch.arange(blocks, dtype=torch.int32)[None], "seq_lens": torch.tensor([3], dtype=torch.int32),
            "query_start_loc": torch.tensor([0, 1], dtype=torch.int32)}


def test_deepseek_latent_width_is_refused_with_fias_limit(emulated):
    """L+R = 512+64 exceeds FIA's head dim limit: a ContractError at the boundary."""
    ops = OpDispatcher(emulated, strict=True)
    q_latent, q_pe = torch.randn(1, 2, 512, dtype=torch.bfloat16), torch.randn(1, 2, 64, dtype=torch.bfloat16)
    cache = torch.randn(2, 16, 576, dtype=torch.bfloat16)
    with pytest.raises(ContractError, match="kv_cache expected a head dim up to 512"):
        ops.mla_attention(q_latent, q_pe, cache, **_paged_metadata(1), scale=0.1)


def test_block_sizes_off_the_16_grid_are_refused_at_the_boundary(emulated):
    ops = OpDispatcher(emulated, strict=True)
    query, cache = torch.randn(1, 2, 16, dtype=torch.float16), torch.randn(2, 8, 2, 16, dtype=torch.float16)
    with pytest.raises(ContractError, match="key_cache expected a block size that is a multiple of 16"):
        ops.paged_attention(query, cache, cache, **_paged_metadata(1), scale=0.25)


def test_clipped_swiglu_in_its_plain_form_is_the_contracts_clipped_silu():
    x = torch.randn(3, 8) * 4
    out = emulator.npu_clipped_swiglu(x, dim=-1, alpha=1.0, limit=2.0, bias=0.0, interleaved=False)
    gate, up = x[:, :4].clamp(max=2.0), x[:, 4:].clamp(-2.0, 2.0)
    torch.testing.assert_close(out, torch.nn.functional.silu(gate) * up)
    with pytest.raises(NpuOperatorError, match="x must be contiguous"):
        emulator.npu_clipped_swiglu(x.t(), dim=-1, limit=2.0)
