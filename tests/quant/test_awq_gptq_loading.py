"""AWQ (GEMM) and GPTQ checkpoints load packed and match the dequantised weights.

The tiny random Llama's projections are quantised here (min/max, asymmetric, fp16
scales) and packed as each format's published definition says, written independently
of accord's readers: AutoAWQ's WQLinear_GEMM (qweight [K, N/8], 8 output channels a
word in the order 0, 2, 4, 6, 1, 3, 5, 7; qzeros alike; scales [K/g, N]) and
AutoGPTQ's QuantLinear.pack (qweight [K*bits/32, N], input channels low bits first;
qzeros [G, N*bits/32] with v1's zero - 1; g_idx for act-order). The same codes,
dequantised here as (q - z) * s, make a plain checkpoint: accord's packed load gives
its greedy tokens, logits within a stated bound."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from group_quant_models import generate, relative_gap, save_tiny_llama, write_pair

from accord.core.quantization import GroupQuantLinear

#: (code - zero) * fp16 scale is exact in fp32 on both sides: only GEMM blocking differs.
LOGITS_BOUND = 1e-5
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def act_order_groups(depth: int, group_size: int, seed: int) -> torch.Tensor:
    """GPTQ's act-order g_idx: the channel at place j of a permutation is in group j // g."""
    permutation = torch.randperm(depth, generator=torch.Generator().manual_seed(seed))
    g_idx = torch.empty(depth, dtype=torch.int32)
    g_idx[permutation] = (torch.arange(depth) // group_size).to(torch.int32)
    return g_idx


def quantise(weight: torch.Tensor, bits: int, g_idx: torch.Tensor, min_zero: int):
    """Min/max asymmetric codes of weight [N, K] per group of input channels: (codes [N,
    K], zeros [N, G], fp16 scales [N, G]); zeros at least `min_zero`."""
    top = (1 << bits) - 1
    groups = int(g_idx.max()) + 1
    scales = torch.empty(weight.shape[0], groups)
    zeros = torch.empty(weight.shape[0], groups, dtype=torch.int64)
    for group in range(groups):
        members = weight[:, g_idx == group]
        low, high = members.amin(1).clamp(max=0), members.amax(1).clamp(min=0)
        scales[:, group] = ((high - low) / top).clamp_min(1e-8)
        zeros[:, group] = torch.round(-low / scales[:, group]).clamp(min_zero, top).long()
    scales = scales.half()
    per_channel_scale, per_channel_zero = scales.float()[:, g_idx.long()], zeros[:, g_idx.long()]
    codes = torch.clamp(torch.round(weight / per_channel_scale) + per_channel_zero, 0, top).long()
    return codes, zeros, scales


def pack_awq(columns: torch.Tensor) -> torch.Tensor:
    """AutoAWQ's packing of [rows, N] 4-bit values into [rows, N/8] int32."""
    packed = torch.zeros(columns.shape[0], columns.shape[1] // 8, dtype=torch.int64)
    for word in range(packed.shape[1]):
        for i, channel in enumerate(AWQ_ORDER):
            packed[:, word] |= columns[:, word * 8 + channel] << (4 * i)
    return as_int32(packed)


def pack_gptq_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """AutoGPTQ's qweight packing of [K, N] values into [K*bits/32, N] int32."""
    per_word = 32 // bits
    packed = torch.zeros(values.shape[0] // per_word, values.shape[1], dtype=torch.int64)
    for row in range(packed.shape[0]):
        for j in range(per_word):
            packed[row] |= values[row * per_word + j] << (bits * j)
    return as_int32(packed)


def as_int32(words: torch.Tensor) -> torch.Tensor:
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def awq_tensors(weight: torch.Tensor, group_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    g_idx = (torch.arange(weight.shape[1]) // group_size).to(torch.int32)
    codes, zeros, scales = quantise(weight, 4, g_idx, 0)
    stored = {"qweight": pack_awq(codes.t()), "qzeros": pack_awq(zeros.t()), "scales": scales.t().contiguous()}
    return stored, dequantised(codes, zeros, scales, g_idx)


def gptq_tensors(
    weight: torch.Tensor, bits: int, group_size: int, act_order: bool, zero_offset: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    depth = weight.shape[1]
    # One permutation per input width: q/k/v (and gate/up) share their input, as GPTQ's do.
    if group_size == -1:  # per channel: every channel in group 0
        g_idx = torch.zeros(depth, dtype=torch.int32)
    else:
        g_idx = act_order_groups(depth, group_size, depth) if act_order else (torch.arange(depth) // group_size).int()
    codes, zeros, scales = quantise(weight, bits, g_idx, zero_offset)
    stored = {
        "qweight": pack_gptq_rows(codes.t(), bits), "qzeros": pack_gptq_columns(zeros.t() - zero_offset, bits),
        "scales": scales.t().contiguous(), "g_idx": g_idx,
    }
    return stored, dequantised(codes, zeros, scales, g_idx)


def pack_gptq_columns(values: torch.Tensor, bits: int) -> torch.Tensor:
    """AutoGPTQ's qzeros packing of [G, N] values into [G, N*bits/32] int32."""
    per_word = 32 // bits
    packed = torch.zeros(values.shape[0], values.shape[1] // per_word, dtype=torch.int64)
    for col in range(packed.shape[1]):
        for j in range(per_word):
            packed[:, col] |= values[:, col * per_word + j] << (bits * j)
    return as_int32(packed)


def dequantised(codes: torch.Tensor, zeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor) -> torch.Tensor:
    """(q - z) * s per channel's group, exact in fp32."""
    groups = g_idx.long()
    return ((codes - zeros[:, groups]).double() * scales.double()[:, groups]).float()


FORMATS = {
    "awq g32": (lambda w: awq_tensors(w, 32),
                {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm"}),
    "gptq int4 g32 act-order v1": (lambda w: gptq_tensors(w, 4, 32, True, 1),
                                   {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
                                    "sym": False}),
    "gptq int4 per-channel v1": (lambda w: gptq_tensors(w, 4, -1, False, 1),
                                 {"quant_method": "gptq", "bits": 4, "group_size": -1, "desc_act": False,
                                  "sym": False}),
    "gptq int8 g64 v2": (lambda w: gptq_tensors(w, 8, 64, False, 0),
                         {"quant_method": "gptq", "bits": 8, "group_size": 64, "desc_act": False, "sym": False,
                          "checkpoint_format": "gptq_v2"}),
}


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("llama_fp32"))


@pytest.mark.slow
@pytest.mark.parametrize("name", FORMATS)
def test_packed_load_matches_the_dequantised_weights(tiny_llama: Path, tmp_path: Path, name: str) -> None:
    quantiser, quant_config = FORMATS[name]
    packed, dense = tmp_path / "packed", tmp_path / "dense"
    write_pair(tiny_llama, packed, dense, quantiser, quant_config)
    packed_logits, packed_tokens, model = generate(packed)
    dense_logits, dense_tokens, _ = generate(dense)
    qkv = model.layers[0].attention.qkv
    assert isinstance(qkv, GroupQuantLinear)
    assert (qkv.weight.g_idx is not None) == ("act-order" in name)
    assert packed_tokens == dense_tokens
    assert relative_gap(packed_logits, dense_logits) < LOGITS_BOUND
