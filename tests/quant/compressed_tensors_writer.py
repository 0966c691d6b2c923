"""Weights quantised and packed by compressed-tensors' own code (its observer-free
min/max qparams, its quantize and its pack-quantized compressor), and unpacked by its
decompressor: the independent side of the cross-checks and the loading tests."""

from __future__ import annotations

import torch
from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams


def scheme(bits: int, symmetric: bool, group_size: int) -> QuantizationScheme:
    """compressed-tensors' weight-only scheme: group strategy, or channel for -1."""
    strategy = {"strategy": "channel"} if group_size == -1 else {"strategy": "group", "group_size": group_size}
    args = QuantizationArgs(num_bits=bits, type="int", symmetric=symmetric, **strategy)
    return QuantizationScheme(targets=["Linear"], weights=args)


def compress(weight: torch.Tensor, chosen: QuantizationScheme) -> dict[str, torch.Tensor]:
    """`weight` [N, K] as pack-quantized stores it (weight_packed, weight_scale,
    weight_shape, and weight_zero_point when asymmetric), min/max qparams per group."""
    args = chosen.weights
    rows = weight.shape[0]
    groups = weight.view(rows, 1, -1) if args.group_size is None else weight.view(rows, -1, args.group_size)
    scales, zeros = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
    state = {"weight": weight, "weight_scale": scales, "weight_zero_point": zeros}
    return dict(PackedQuantizationCompressor.compress(state, chosen))


def decompress(state: dict[str, torch.Tensor], chosen: QuantizationScheme) -> torch.Tensor:
    """compressed-tensors' own dequantised weight (in the scales' dtype)."""
    return PackedQuantizationCompressor.decompress(dict(state), chosen)["weight"]


def quantization_config(bits: int, symmetric: bool, group_size: int) -> dict:
    """config.json's quantization_config for this scheme, as llm-compressor writes it."""
    weights = scheme(bits, symmetric, group_size).weights.model_dump(mode="json")
    return {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                      "output_activations": None, "format": "pack-quantized"}},
    }


def quantiser(chosen: QuantizationScheme):
    """A group_quant_models quantiser: a weight's pack-quantized tensors and the weight
    compressed-tensors' decompressor makes of them."""

    def quantise(weight: torch.Tensor) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        state = compress(weight, chosen)
        return state, decompress(state, chosen)

    return quantise
