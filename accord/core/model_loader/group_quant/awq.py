"""AutoAWQ's GEMM layout, converted to group_quant_linear's at load: `qweight` int32
[K, N/8] packs 8 output channels' 4-bit codes per word in the order 0, 2, 4, 6, 1, 3, 5,
7 (nibble i holds channel 8j + ORDER[i]); `qzeros` int32 [K/g, N/8] packs the zero
points the same way; `scales` [K/g, N]."""

from __future__ import annotations

import torch

from ....op_contracts import pack_codes, unpack_codes
from ...quantization import GroupQuantWeight
from ..hf_checkpoint import SafetensorsCheckpoint
from .scheme import GroupQuantScheme
from .stored import GROUP, WORD, StoredLinear, StoredPart

MARKER = "qweight"
#: Where the rows and input channels run in each stored tensor: 8 output channels a word.
PARTS = (
    StoredPart(MARKER, n_dim=1, k_dim=0, n_unit=WORD),
    StoredPart("qzeros", n_dim=1, k_dim=0, n_unit=WORD, k_unit=GROUP),
    StoredPart("scales", n_dim=1, k_dim=0, k_unit=GROUP),
)
#: AWQ has no act-order: no g_idx is stored.
G_IDX = None
#: Nibble of each channel within its word: channel c of a word sits at nibble
#: UNPACK[c] (the inverse of AWQ's packing order 0, 2, 4, 6, 1, 3, 5, 7).
UNPACK = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])
PER_WORD = 8


def shape(checkpoint: SafetensorsCheckpoint, prefix: str, scheme: GroupQuantScheme) -> tuple[int, int]:
    """(N, K) of the linear: qweight is [K, N/8]."""
    depth, words = checkpoint.shape(f"{prefix}.{MARKER}")
    return words * PER_WORD, depth


def channel_codes(words: torch.Tensor) -> torch.Tensor:
    """[rows, N/8] AWQ words -> [rows, N] uint8 codes in channel order."""
    nibbles = unpack_codes(words, 4, words.shape[1] * PER_WORD).view(words.shape[0], -1, PER_WORD)
    return nibbles[:, :, UNPACK].reshape(words.shape[0], -1)


def read(stored: StoredLinear, scheme: GroupQuantScheme) -> GroupQuantWeight:
    """The window read of the linear, its codes repacked along K and its scales and zeros
    transposed."""
    codes = channel_codes(stored.read(MARKER)).t()
    zeros = channel_codes(stored.read("qzeros")).t().contiguous()
    scales = stored.read("scales").t().contiguous()
    return GroupQuantWeight(pack_codes(codes, 4), scales, zeros, None, 4, scheme.group_size, stored.shape[1])
