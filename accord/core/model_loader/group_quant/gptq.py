"""GPTQ's layout (AutoGPTQ / GPTQModel), converted to group_quant_linear's at load:
`qweight` int32 [K*bits/32, N] packs each output channel's codes along K, code k of a
column at bit (k*bits) % 32 of word k*bits // 32: transposed, exactly the canonical
rows. `qzeros` int32 [G, N*bits/32] packs the zero points along N the same way; v1
checkpoints (checkpoint_format gptq) store each zero point minus one. `scales` [G, N];
`g_idx` [K] the group of each input channel (act-order), dropped where it is k //
group_size (stored.py)."""

from __future__ import annotations

import torch

from ....op_contracts import unpack_codes
from ...quantization import GroupQuantWeight
from ..hf_checkpoint import SafetensorsCheckpoint
from .scheme import GroupQuantScheme
from .stored import GROUP, WORD, StoredLinear, StoredPart

MARKER = "qweight"
#: Where the rows and input channels run in each stored tensor: codes packed along K,
#: zero points along N.
PARTS = (
    StoredPart(MARKER, n_dim=1, k_dim=0, k_unit=WORD),
    StoredPart("qzeros", n_dim=1, k_dim=0, n_unit=WORD, k_unit=GROUP),
    StoredPart("scales", n_dim=1, k_dim=0, k_unit=GROUP),
)
G_IDX = "g_idx"


def shape(checkpoint: SafetensorsCheckpoint, prefix: str, scheme: GroupQuantScheme) -> tuple[int, int]:
    """(N, K) of the linear: qweight is [K*bits/32, N]."""
    words, rows = checkpoint.shape(f"{prefix}.{MARKER}")
    return rows, words * 32 // scheme.bits


def read(stored: StoredLinear, scheme: GroupQuantScheme) -> GroupQuantWeight:
    """The window read of the linear, its codes and scales transposed, zero points
    unpacked (plus v1's one)."""
    rows, depth = stored.shape
    zeros = unpack_codes(stored.read("qzeros"), scheme.bits, rows).to(torch.int16) + scheme.zero_offset
    return GroupQuantWeight(
        stored.read(MARKER).t().contiguous(), stored.read("scales").t().contiguous(),
        zeros.t().to(torch.uint8).contiguous(), stored.g_idx, scheme.bits, scheme.group_size, depth,
    )
