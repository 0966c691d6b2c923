"""compressed-tensors' pack-quantized tensors, which already are group_quant_linear's
layout: `weight_packed` int32 [N, cdiv(K*bits, 32)] (pack_to_int32: codes offset by
2**(bits-1), code k at bit k*bits), `weight_scale` [N, G], `weight_shape` [N, K], and
for asymmetric schemes `weight_zero_point` int32 [cdiv(N*bits, 32), G], the offset zero
points packed the same way along N; `weight_g_idx` [K] in checkpoints written with
activation ordering (dropped where it is k // group_size, stored.py)."""

from __future__ import annotations

from ....op_contracts import unpack_codes
from ...quantization import GroupQuantWeight
from ..hf_checkpoint import SafetensorsCheckpoint
from .scheme import GroupQuantScheme
from .stored import GROUP, WORD, StoredLinear, StoredPart

#: The tensor that marks a linear stored this way (`prefix.weight_packed`).
MARKER = "weight_packed"
ZEROS = "weight_zero_point"
#: Where the rows and input channels run in each stored tensor (weight_shape is read
#: whole, by `shape`).
PARTS = (
    StoredPart(MARKER, n_dim=0, k_dim=1, k_unit=WORD),
    StoredPart("weight_scale", n_dim=0, k_dim=1, k_unit=GROUP),
    StoredPart(ZEROS, n_dim=0, k_dim=1, n_unit=WORD, k_unit=GROUP),
)
G_IDX = "weight_g_idx"


def shape(checkpoint: SafetensorsCheckpoint, prefix: str, scheme: GroupQuantScheme) -> tuple[int, int]:
    """(N, K) of the linear, from its weight_shape tensor."""
    rows, depth = checkpoint.read(f"{prefix}.weight_shape").tolist()
    return int(rows), int(depth)


def read(stored: StoredLinear, scheme: GroupQuantScheme) -> GroupQuantWeight:
    """The window read of the linear as a GroupQuantWeight (the packed codes as stored)."""
    rows, depth = stored.shape
    zeros = None
    if scheme.symmetric and ZEROS in stored:
        # Older compressors kept a symmetric scheme's zero points (all 0, signed): marked
        # read so the loader does not report them, and not used.
        stored.skip(ZEROS)
    if not scheme.symmetric:
        # Packed along N: unpack the transpose, whose rows are the groups.
        zeros = unpack_codes(stored.read(ZEROS).t().contiguous(), scheme.bits, rows).t().contiguous()
    return GroupQuantWeight(
        stored.read(MARKER), stored.read("weight_scale"), zeros, stored.g_idx, scheme.bits, scheme.group_size, depth,
    )
