"""GPTQ's layout (AutoGPTQ / GPTQModel), converted to group_quant_linear's at load:
`qweight` int32 [K*bits/32, N] packs each output channel's codes along K, code k of a
column at bit (k*bits) % 32 of word k*bits // 32: transposed, exactly the canonical
rows. `qzeros` int32 [G, N*bits/32] packs the zero points along N the same way; v1
checkpoints (checkpoint_format gptq) store each zero point minus one. `scales` [G, N];
`g_idx` [K] the group of each input channel (act-order), dropped where it is k //
group_size."""

from __future__ import annotations

import torch

from ....op_contracts import PER_CHANNEL, unpack_codes
from ...quantization import GroupQuantWeight
from ..hf_checkpoint import SafetensorsCheckpoint
from .scheme import GroupQuantScheme

MARKER = "qweight"


def shape(checkpoint: SafetensorsCheckpoint, prefix: str, scheme: GroupQuantScheme) -> tuple[int, int]:
    """(N, K) of the linear: qweight is [K*bits/32, N]."""
    words, rows = checkpoint.shape(f"{prefix}.{MARKER}")
    return rows, words * 32 // scheme.bits


def read(checkpoint: SafetensorsCheckpoint, prefix: str, scheme: GroupQuantScheme) -> GroupQuantWeight:
    """The linear, its codes and scales transposed, zero points unpacked (plus v1's one)."""
    rows, depth = shape(checkpoint, prefix, scheme)
    packed_zeros = checkpoint.read(f"{prefix}.qzeros")
    zeros = unpack_codes(packed_zeros, scheme.bits, rows).to(torch.int16) + scheme.zero_offset
    g_idx_name = f"{prefix}.g_idx"
    g_idx = checkpoint.read(g_idx_name).to(torch.int32) if g_idx_name in checkpoint else None
    if g_idx is not None and _sequential(g_idx, scheme.group_size):
        g_idx = None
    return GroupQuantWeight(
        checkpoint.read(f"{prefix}.{MARKER}").t().contiguous(), checkpoint.read(f"{prefix}.scales").t().contiguous(),
        zeros.t().to(torch.uint8).contiguous(), g_idx, scheme.bits, scheme.group_size, depth,
    )


def _sequential(g_idx: torch.Tensor, group_size: int) -> bool:
    """Whether g_idx is k // group_size, or all 0 per channel (GPTQ without act-order
    stores it anyway)."""
    if group_size == PER_CHANNEL:
        return bool((g_idx == 0).all())
    return torch.equal(g_idx.long(), torch.arange(g_idx.shape[0]) // group_size)
