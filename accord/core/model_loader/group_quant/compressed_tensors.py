"""compressed-tensors' pack-quantized tensors, which already are group_quant_linear's
layout: `weight_packed` int32 [N, cdiv(K*bits, 32)] (pack_to_int32: codes offset by
2**(bits-1), code k at bit k*bits), `weight_scale` [N, G], `weight_shape` [N, K], and
for asymmetric schemes `weight_zero_point` int32 [cdiv(N*bits, 32), G], the offset zero
points packed the same way along N; `weight_g_idx` [K] in checkpoints written with
activation ordering."""

from __future__ import annotations

import torch

from ....op_contracts import unpack_codes
from ...quantization import GroupQuantWeight
from ..hf_checkpoint import SafetensorsCheckpoint
from .scheme import GroupQuantScheme

#: The tensor that marks a linear stored this way (`prefix.weight_packed`).
MARKER = "weight_packed"


def shape(checkpoint: SafetensorsCheckpoint, prefix: str, scheme: GroupQuantScheme) -> tuple[int, int]:
    """(N, K) of the linear, from its weight_shape tensor."""
    rows, depth = checkpoint.read(f"{prefix}.weight_shape").tolist()
    return int(rows), int(depth)


def read(checkpoint: SafetensorsCheckpoint, prefix: str, scheme: GroupQuantScheme) -> GroupQuantWeight:
    """The linear's tensors as a GroupQuantWeight (the packed codes as stored)."""
    rows, depth = shape(checkpoint, prefix, scheme)
    zeros = None
    stored_zeros = f"{prefix}.weight_zero_point"
    if scheme.symmetric and stored_zeros in checkpoint:
        # Older compressors kept a symmetric scheme's zero points (all 0, signed): read
        # so the loader does not report them, and not used.
        checkpoint.read(stored_zeros)
    if not scheme.symmetric:
        # Packed along N: unpack the transpose, whose rows are the groups.
        packed = checkpoint.read(stored_zeros)
        zeros = unpack_codes(packed.t().contiguous(), scheme.bits, rows).t().contiguous()
    g_idx_name = f"{prefix}.weight_g_idx"
    g_idx = checkpoint.read(g_idx_name).to(torch.int32) if g_idx_name in checkpoint else None
    return GroupQuantWeight(
        checkpoint.read(f"{prefix}.{MARKER}"), checkpoint.read(f"{prefix}.weight_scale"), zeros, g_idx,
        scheme.bits, scheme.group_size, depth,
    )
