"""Quantised weights. FP8: the fp8 linear layer (activations quantised per call through
`ops.quantize_fp8`, product through `ops.scaled_mm`) and the load-time conversions
(quantise a bf16 weight per output channel or per 128x128 block, dequantise blocks);
storage is OCP e4m3fn, as the core keeps fp8, and block scales are DeepSeek's
`weight_scale_inv` (dequantised value = stored * scale). GGUF: weights kept in their
file's blocks (`GgufWeight`), computed through `ops.quant_linear` (`QuantLinear`), and
token embeddings looked up through `ops.quant_embedding` (`QuantEmbedding`).
Group-quantised int4/int8 (`GroupQuantWeight`: one linear's codes, scales, zero
points and g_idx in group_quant_linear's layout, whatever checkpoint format they were
read from): through `ops.group_quant_linear` (`GroupQuantLinear`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Sequence

import torch

from ..op_contracts import FP8_MAX, PER_CHANNEL, OpDispatcher
from .models.layers.linear import Linear

FP8_DTYPE = torch.float8_e4m3fn
#: DeepSeek's block shape: 1x128 activation groups, 128x128 weight tiles.
BLOCK = 128
#: Activation granule for each weight scale layout (scaled_mm's scale_mode).
ACTIVATION_MODE = {"block": "per_group", "row": "per_token"}


class Fp8Linear:
    """y = x @ W^T (+ bias) with W stored in fp8: x is quantised dynamically (per
    128-wide group for block-scaled weights, per token for per-channel ones)."""

    def __init__(
        self, ops: OpDispatcher, weight: torch.Tensor, weight_scale: torch.Tensor, scale_mode: str,
        bias: torch.Tensor | None = None,
    ) -> None:
        self.ops = ops
        self.weight = weight
        self.weight_scale = weight_scale
        self.scale_mode = scale_mode
        self.bias = bias
        self.out_features = weight.shape[0]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] in the compute dtype -> [T, N] in the same dtype."""
        q, scales = self.ops.quantize_fp8(x, mode=ACTIVATION_MODE[self.scale_mode], fp8_dtype=self.weight.dtype)
        return self.ops.scaled_mm(
            q, self.weight, scales, self.weight_scale, self.bias, scale_mode=self.scale_mode, out_dtype=x.dtype
        )


def quantize_per_channel(
    ops: OpDispatcher, weight: torch.Tensor, fp8_dtype: torch.dtype = FP8_DTYPE
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight [N, K], fp32 scales [N, 1]): one scale per output channel, computed by
    the backend's quantize_fp8 (a weight row is a 'token' of the per-token mode), in
    `fp8_dtype` (the device's format: `Backend.fp8_dtype()`)."""
    return ops.quantize_fp8(weight.contiguous(), mode="per_token", fp8_dtype=fp8_dtype)


def quantize_blocks(weight: torch.Tensor, fp8_dtype: torch.dtype = FP8_DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 weight, fp32 scales [cdiv(rows,128), cdiv(cols,128)]) for a weight [..., rows,
    cols], one scale per 128x128 tile: the layout fused_moe's fp8 path reads. Stored in
    `fp8_dtype` (the device's format), scaled to that format's range."""
    *lead, rows, cols = weight.shape
    block_rows, block_cols = -(-rows // BLOCK), -(-cols // BLOCK)
    padded = torch.nn.functional.pad(weight.float(), (0, block_cols * BLOCK - cols, 0, block_rows * BLOCK - rows))
    tiles = padded.view(*lead, block_rows, BLOCK, block_cols, BLOCK)
    limit = FP8_MAX[fp8_dtype]
    scales = tiles.abs().amax(dim=(-3, -1)).clamp_min(1e-10) / limit
    quantised = (tiles / scales[..., :, None, :, None]).clamp(-limit, limit).to(fp8_dtype)
    return quantised.view(*lead, block_rows * BLOCK, block_cols * BLOCK)[..., :rows, :cols].contiguous(), scales


def dequantize_blocks(weight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A block-quantised [rows, cols] weight as `dtype` (for weights a graph uses densely,
    like MLA's absorbed up-projections)."""
    rows, cols = weight.shape
    per_element = scales.repeat_interleave(BLOCK, 0)[:rows].repeat_interleave(BLOCK, 1)[:, :cols]
    return (weight.float() * per_element).to(dtype)


@dataclass(frozen=True)
class GgufWeight:
    """A linear weight [N, in_features] kept as its GGUF blocks: `qweight` [N, row bytes]
    uint8, each row the blocks of `quant_type` (a name in op_contracts.GGUF_FORMATS) as
    ggml lays them out."""

    qweight: torch.Tensor
    quant_type: str
    in_features: int

    @property
    def out_features(self) -> int:
        """N, the weight's rows."""
        return self.qweight.shape[0]

    def to(self, device: torch.device) -> GgufWeight:
        """The same blocks on `device`."""
        return GgufWeight(self.qweight.to(device), self.quant_type, self.in_features)


@dataclass(frozen=True)
class GroupQuantWeight:
    """A linear weight [N, in_features] as group_quant_linear takes it: `qweight` int32
    [N, cdiv(K*bits, 32)] codes packed along K, `scales` [N, G], `zeros` uint8 [N, G]
    (None: symmetric), `g_idx` int32 [K] (None: channel k in group k // group_size)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    g_idx: torch.Tensor | None
    bits: int
    group_size: int
    in_features: int

    @property
    def out_features(self) -> int:
        """N, the weight's rows."""
        return self.qweight.shape[0]

    def to(self, device: torch.device) -> GroupQuantWeight:
        """The same weight with every tensor on `device`."""
        moved = {
            name: None if value is None else value.to(device)
            for name, value in (("qweight", self.qweight), ("scales", self.scales), ("zeros", self.zeros),
                                ("g_idx", self.g_idx))
        }
        return dataclasses.replace(self, **moved)

    def rows(self, start: int, stop: int) -> GroupQuantWeight:
        """Output rows [start, stop) (a column-parallel shard): every tensor but g_idx."""
        zeros = None if self.zeros is None else self.zeros[start:stop].contiguous()
        return dataclasses.replace(
            self, qweight=self.qweight[start:stop].contiguous(), scales=self.scales[start:stop].contiguous(), zeros=zeros,
        )

    def columns(self, start: int, stop: int) -> GroupQuantWeight:
        """Input channels [start, stop) (a row-parallel shard): whole words of codes, and
        whole groups of scales and zeros (with g_idx every group stays, g_idx is cut).
        Raises ValueError for a slice that would split a word or a group."""
        problem = column_split_problem(start, stop, self.in_features, self.bits, self.group_size, self.g_idx is not None)
        if problem is not None:
            raise ValueError(problem)
        per_word = 32 // self.bits
        codes = self.qweight[:, start // per_word : -(-stop // per_word)].contiguous()
        if self.g_idx is not None:
            g_idx = self.g_idx[start:stop].contiguous()
            return dataclasses.replace(self, qweight=codes, g_idx=g_idx, in_features=stop - start)
        groups = slice(None)
        if self.group_size != PER_CHANNEL:
            groups = slice(start // self.group_size, -(-stop // self.group_size))
        zeros = None if self.zeros is None else self.zeros[:, groups].contiguous()
        return dataclasses.replace(
            self, qweight=codes, scales=self.scales[:, groups].contiguous(), zeros=zeros, in_features=stop - start,
        )

    def stacks_with(self, other: GroupQuantWeight) -> bool:
        """Whether `other`'s rows can follow this weight's in one packed weight (a fused
        q/k/v or gate/up): same codes, groups, scales dtype, zero points and g_idx."""
        same_zeros = (self.zeros is None) == (other.zeros is None)
        same_groups = (self.g_idx is None and other.g_idx is None) or (
            self.g_idx is not None and other.g_idx is not None and torch.equal(self.g_idx, other.g_idx)
        )
        return (
            (self.bits, self.group_size, self.in_features, self.scales.dtype)
            == (other.bits, other.group_size, other.in_features, other.scales.dtype)
            and same_zeros and same_groups
        )


def column_split_problem(
    start: int, stop: int, in_features: int, bits: int, group_size: int, act_order: bool
) -> str | None:
    """Why input channels [start, stop) of a group-quantised weight cannot be its own
    weight (None: they can): the codes are packed along K in 32-bit words, and without
    act-order's g_idx each channel's group is k // group_size, so a cut must fall on a
    word edge and, without g_idx, on a group edge (the last channel counts as both)."""
    edges = [(32 // bits, "a word of codes")]
    if not act_order and group_size != PER_CHANNEL:
        edges.append((group_size, "a group"))
    for step, what in edges:
        if start % step or (stop % step and stop != in_features):
            return f"input channels [{start}:{stop}] of {in_features} split {what} ({step} channels)"
    return None


def stack_rows(parts: Sequence[GroupQuantWeight]) -> GroupQuantWeight:
    """Weights whose rows stack (`stacks_with`) as one weight, rows in order."""
    first = parts[0]
    zeros = None if first.zeros is None else torch.cat([part.zeros for part in parts])  # type: ignore[misc]
    return dataclasses.replace(
        first, qweight=torch.cat([part.qweight for part in parts]), scales=torch.cat([part.scales for part in parts]),
        zeros=zeros,
    )


class PackedLinear:
    """What the linears over packed weights share: the dispatcher, the weight, an
    optional bias and the output dtype (fp32 for a head whose logits stay fp32, else
    x's)."""

    def __init__(
        self, ops: OpDispatcher, weight: GgufWeight | GroupQuantWeight, bias: torch.Tensor | None = None,
        out_dtype: torch.dtype | None = None,
    ) -> None:
        self.ops = ops
        self.weight = weight
        self.bias = bias
        self.out_dtype = out_dtype
        self.out_features = weight.out_features


class QuantLinear(PackedLinear):
    """y = x @ W^T (+ bias) with W kept in its GGUF blocks (`GgufWeight`), through
    `ops.quant_linear`."""

    weight: GgufWeight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, N]."""
        weight = self.weight
        return self.ops.quant_linear(x, weight.qweight, self.bias, quant_type=weight.quant_type, out_dtype=self.out_dtype)


class QuantEmbedding:
    """An embedding table kept as its GGUF blocks (`GgufWeight`, one row per token),
    each looked-up row dequantised to `dtype` through `ops.quant_embedding`."""

    def __init__(self, ops: OpDispatcher, weight: GgufWeight, dtype: torch.dtype) -> None:
        self.ops = ops
        self.weight = weight
        self.dtype = dtype

    @property
    def rows(self) -> int:
        """V, the table's rows."""
        return self.weight.out_features

    @property
    def device(self) -> torch.device:
        """Where the blocks live."""
        return self.weight.qweight.device

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> rows [T, H] in `dtype`."""
        w = self.weight
        return self.ops.quant_embedding(
            ids, w.qweight, quant_type=w.quant_type, hidden_size=w.in_features, out_dtype=self.dtype
        )


class GroupQuantLinear(PackedLinear):
    """y = x @ W^T (+ bias) with W kept as group-quantised codes (`GroupQuantWeight`),
    through `ops.group_quant_linear`."""

    weight: GroupQuantWeight

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, N]."""
        w = self.weight
        return self.ops.group_quant_linear(
            x, w.qweight, w.scales, w.zeros, w.g_idx, self.bias, bits=w.bits, group_size=w.group_size,
            out_dtype=self.out_dtype,
        )


class ConcatenatedLinear:
    """Several linears on the same input whose outputs sit side by side: a fused q/k/v or
    gate/up whose parts a GGUF file stores in different formats (llama.cpp's Q4_K_M keeps
    some v and down projections in Q6_K), so they cannot share one packed weight."""

    def __init__(self, parts: Sequence[Linear]) -> None:
        self.parts = list(parts)
        self.out_features = sum(part.out_features for part in self.parts)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] -> [T, sum of the parts' N]."""
        return torch.cat([part(x) for part in self.parts], dim=-1)
