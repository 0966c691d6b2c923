"""Hands each layer its checkpoint tensors: cast to the model dtype, shape-checked, fused
(q/k/v, gate/up) and stacked (experts for fused_moe), fp8 kept or made as configured.

Layers pull tensors by their Hugging Face names; whatever nobody pulled is an
unexpected tensor, and a name that is absent is a missing one. Both are errors that
name the tensor.

Under tensor parallelism each rank reads only its shard of a tensor from disk (a
safetensors slice, never the whole tensor); fp8 block scales are sliced with their
weights, so a shard must start and end on a 128-wide tile. Under expert parallelism a
rank reads its own experts whole and never opens the other ranks' experts.

A checkpoint that can hand out packed blocks (a GGUF file's `read_packed`) gives its
linear weights as `GgufWeight`s, computed by `QuantLinear`: whole rows of a
column-parallel shard, and columns of a row-parallel one where they fall on block
edges (else that shard is read dequantised, as every other tensor is). A
group-quantised checkpoint (AWQ, GPTQ, compressed-tensors) gives `GroupQuantWeight`s,
computed by `GroupQuantLinear`, sliced the same way (on whole words and groups).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ...op_contracts import FP8_DTYPES, OpDispatcher
from .. import quantization
from ..distributed import ParallelContext
from ..distributed.sharding import WHOLE, Shard, expert_range, split_evenly
from ..model_loader.hf_checkpoint import CheckpointError, SafetensorsCheckpoint
from .layers.embedding import DenseEmbedding, EmbeddingTable
from .layers.linear import DenseLinear, Linear
from .layers.parallel import RowParallelLinear


if TYPE_CHECKING:
    #: A linear weight a checkpoint hands out packed: GGUF blocks or group-quantised codes.
    PackedWeight = quantization.GgufWeight | quantization.GroupQuantWeight


def _stacked_packed(parts: Sequence[PackedWeight | None]) -> PackedWeight | None:
    """The parts of a fused linear as one packed weight, where every part is packed
    alike (one GGUF format; group-quantised weights that `stacks_with` each other); else None."""
    first = parts[0]
    if isinstance(first, quantization.GgufWeight):
        if all(isinstance(part, quantization.GgufWeight) and part.quant_type == first.quant_type for part in parts):
            qweight = torch.cat([part.qweight for part in parts])  # type: ignore[union-attr]
            return quantization.GgufWeight(qweight, first.quant_type, first.in_features)
        return None
    if isinstance(first, quantization.GroupQuantWeight) and all(
        isinstance(part, quantization.GroupQuantWeight) and first.stacks_with(part) for part in parts
    ):
        return quantization.stack_rows(parts)  # type: ignore[arg-type]
    return None


@dataclass(frozen=True)
class ExpertWeights:
    """Routed experts stacked as fused_moe takes them: w13 [E, 2I, H] (gate rows, then
    up rows), w2 [E, H, I], their 128x128 block scales when fp8, and under expert
    parallelism the expert_map (global expert id -> row here, -1 on another rank)."""

    w13: torch.Tensor
    w2: torch.Tensor
    w13_scale: torch.Tensor | None = None
    w2_scale: torch.Tensor | None = None
    expert_map: torch.Tensor | None = None


class WeightLoader:
    """Reads one checkpoint into layer weights of `dtype` on `device`. `quantize_fp8`
    turns dense linear weights into fp8 at load (per output channel; experts per
    128x128 block, the one fp8 layout fused_moe takes). `parallel` says which
    tensor-parallel shard of each split tensor this rank holds."""

    def __init__(
        self, checkpoint: SafetensorsCheckpoint, ops: OpDispatcher, dtype: torch.dtype, device: torch.device,
        quantize_fp8: bool = False, parallel: ParallelContext | None = None,
    ) -> None:
        self.checkpoint = checkpoint
        self.ops = ops
        self.dtype = dtype
        self.device = device
        self.quantize_fp8 = quantize_fp8
        self.parallel = parallel or ParallelContext.single()
        #: The device's fp8 format: what load-time quantisation produces.
        self.fp8_dtype = ops.backend.fp8_dtype()  # type: ignore[attr-defined]
        #: Name prefixes of the experts other expert-parallel ranks load (not unexpected here).
        self._other_ranks_experts: list[str] = []

    def tensor(
        self, name: str, shape: Sequence[int], dtype: torch.dtype | None = None, shard: Shard = WHOLE
    ) -> torch.Tensor:
        """One tensor (this rank's `shard` of it) as `dtype` (the model dtype by
        default), the whole checked against `shape`."""
        return self._read(name, shape, shard).to(device=self.device, dtype=dtype or self.dtype).contiguous()

    def scalar(self, name: str) -> float | None:
        """A one-element tensor's value (a per-tensor scale), None when the checkpoint
        has no `name`; a tensor of more elements is refused."""
        if name not in self.checkpoint:
            return None
        shape = self.checkpoint.shape(name)
        if math.prod(shape) != 1:
            raise CheckpointError(
                f"{self.checkpoint.model_dir}: tensor {name!r} has shape {shape}; one value (a per-tensor scale) "
                "is supported here"
            )
        return float(self.checkpoint.read(name).to(torch.float64).item())

    def dense_weight(self, prefix: str, shape: Sequence[int], shard: Shard = WHOLE) -> torch.Tensor:
        """`prefix.weight` (this rank's `shard`) in the model dtype, dequantised if the
        checkpoint stores fp8."""
        weight = self._read(f"{prefix}.weight", shape, shard)
        if weight.dtype in FP8_DTYPES:
            weight = quantization.dequantize_blocks(weight, self._block_scale(prefix, shape, shard), self.dtype)
        return weight.to(device=self.device, dtype=self.dtype).contiguous()

    def linear(
        self, prefixes: Sequence[str], in_features: int, out_features: Sequence[int], bias: bool = False,
        shards: Sequence[Shard] | None = None,
    ) -> Linear:
        """One linear layer from the `prefix.weight` of each part, stacked along the output
        dim (q/k/v or gate/up fused into one GEMM). Column-parallel when `shards` gives
        each part's output rows for this rank (no collective: the output stays split)."""
        shards = shards or [WHOLE] * len(prefixes)
        biases = None
        if bias:
            biases = torch.cat(
                [self.tensor(f"{p}.bias", (n,), shard=s) for p, n, s in zip(prefixes, out_features, shards)]
            )
        packed = [self._packed(f"{p}.weight", (n, in_features), s) for p, n, s in zip(prefixes, out_features, shards)]
        if any(weight is not None for weight in packed):
            return self._packed_linear(prefixes, packed, in_features, out_features, shards, biases)
        parts = [self._read(f"{p}.weight", (n, in_features), s) for p, n, s in zip(prefixes, out_features, shards)]
        if parts[0].dtype in FP8_DTYPES:
            full_shapes = [(n, in_features) for n in out_features]
            weight, scale = self._device_fp8(*self._stacked_blocks(prefixes, parts, full_shapes, shards))
            return quantization.Fp8Linear(self.ops, weight, scale, "block", biases)
        return self._local_linear(self._stacked(parts), biases)

    def embedding(self, name: str, shape: Sequence[int], shard: Shard) -> EmbeddingTable:
        """This rank's `shard` of vocabulary rows of the embedding `name`: kept in its
        blocks where the checkpoint keeps it packed (a GGUF file's table: rows are
        dequantised as they are looked up), else dense in the model dtype."""
        packed = self._packed(name, shape, shard)
        if isinstance(packed, quantization.GgufWeight):
            return quantization.QuantEmbedding(self.ops, packed, self.dtype)
        return DenseEmbedding(self.tensor(name, shape, shard=shard))

    def lm_head(self, name: str, shape: Sequence[int], shard: Shard, tied: EmbeddingTable | None = None) -> Linear:
        """The LM head over this rank's `shard` of vocabulary rows, with fp32 logits: over
        the `tied` embedding's rows where the head shares them (its blocks, or its dense
        tensor: the table is held once), else over `name`'s, kept packed where the
        checkpoint keeps it packed (a GGUF file's Q8_0 or Q6_K table, which then streams
        a quarter of the fp32 bytes each decode step)."""
        if isinstance(tied, quantization.QuantEmbedding):
            return self._packed_layer(tied.weight, None, out_dtype=torch.float32)
        if isinstance(tied, DenseEmbedding):
            return DenseLinear(self.ops, tied.weight, out_dtype=torch.float32)
        packed = self._packed(name, shape, shard)
        if packed is not None:
            return self._packed_layer(packed, None, out_dtype=torch.float32)
        return DenseLinear(self.ops, self.tensor(name, shape, shard=shard), out_dtype=torch.float32)

    def row_parallel_linear(
        self, prefix: str, in_features: int, out_features: int, reduce: bool = True, columns: Shard | None = None
    ) -> Linear:
        """`prefix.weight` split along its input dim across the ranks (o_proj, down): each
        rank multiplies its slice of the activations (`columns`, where the caller's
        activations are split otherwise than equally), and the partial products are
        summed over the ranks (unless `reduce` is False: the caller sums several at once)."""
        shard = columns or split_evenly(self.parallel, in_features, f"{prefix} input features", dim=1)
        packed = self._packed(f"{prefix}.weight", (out_features, in_features), shard)
        weight = packed or self._read(f"{prefix}.weight", (out_features, in_features), shard)
        if not isinstance(weight, torch.Tensor):
            local: Linear = self._packed_layer(weight, None)
        elif weight.dtype in FP8_DTYPES:
            fp8_weight, scale = self._device_fp8(
                weight.to(self.device).contiguous(), self._block_scale(prefix, (out_features, in_features), shard)
            )
            local = quantization.Fp8Linear(self.ops, fp8_weight, scale, "block")
        else:
            local = self._local_linear(weight, None)
        if self.parallel.tp_size == 1 or not reduce:
            return local
        return RowParallelLinear(local, self.parallel.comm())

    def experts(
        self, prefix: str, num_experts: int, names: tuple[str, str, str], hidden: int, intermediate: int
    ) -> ExpertWeights:
        """Experts `prefix.{e}.{gate,up,down}.weight` (names in that order) stacked for
        fused_moe: kept fp8 with their block scales, quantised, or in the model dtype.
        Under tensor parallelism each rank holds every expert's slice of the
        intermediate dim (gate/up rows, down columns); under expert parallelism each
        holds a contiguous range of whole experts and an expert_map to them. Either way
        the outputs sum over the ranks."""
        gate, up, down = names
        if self.parallel.ep_size > 1:
            local = self._local_experts(prefix, num_experts)
            rows = cols = WHOLE
        else:
            local = range(num_experts)
            rows = split_evenly(self.parallel, intermediate, f"{prefix} intermediate size")
            cols = Shard(1, rows.index, rows.count)
        w13 = [[f"{prefix}.{e}.{gate}", f"{prefix}.{e}.{up}"] for e in local]
        w13_parts = [[self._read(f"{p}.weight", (intermediate, hidden), rows) for p in pair] for pair in w13]
        w2_parts = [self._read(f"{prefix}.{e}.{down}.weight", (hidden, intermediate), cols) for e in local]
        expert_map = self._expert_map(local, num_experts)
        if w2_parts[0].dtype in FP8_DTYPES:
            w13_stacked = [
                self._stacked_blocks(pair, parts, [(intermediate, hidden)] * 2, [rows, rows])
                for pair, parts in zip(w13, w13_parts)
            ]
            w2_scales = [self._block_scale(f"{prefix}.{e}.{down}", (hidden, intermediate), cols) for e in local]
            w13_fp8, w13_scale = self._device_fp8(
                torch.stack([w for w, _ in w13_stacked]).to(self.device),
                torch.stack([s for _, s in w13_stacked]).to(self.device),
            )
            w2_fp8, w2_scale = self._device_fp8(torch.stack(w2_parts).to(self.device), torch.stack(w2_scales).to(self.device))
            return ExpertWeights(w13_fp8, w2_fp8, w13_scale, w2_scale, expert_map)
        w13_dense = torch.stack([torch.cat(parts) for parts in w13_parts]).to(device=self.device, dtype=self.dtype)
        w2_dense = torch.stack(w2_parts).to(device=self.device, dtype=self.dtype)
        if self.quantize_fp8:
            (w13_q, w13_s), (w2_q, w2_s) = (quantization.quantize_blocks(w, self.fp8_dtype) for w in (w13_dense, w2_dense))
            return ExpertWeights(w13_q, w2_q, w13_s, w2_s, expert_map)
        return ExpertWeights(w13_dense.contiguous(), w2_dense.contiguous(), expert_map=expert_map)

    def _local_experts(self, prefix: str, num_experts: int) -> range:
        """This expert-parallel rank's contiguous range of experts (`expert_range`: the
        first num_experts % ep_size ranks hold one more); records the others' names as
        loaded elsewhere."""
        local = expert_range(num_experts, self.parallel.ep_size, self.parallel.ep_rank)
        self._other_ranks_experts += [f"{prefix}.{e}." for e in range(num_experts) if e not in local]
        return local

    def _expert_map(self, local: range, num_experts: int) -> torch.Tensor | None:
        """fused_moe's expert_map for experts `local` of `num_experts` (None: all here)."""
        if len(local) == num_experts:
            return None
        expert_map = torch.full((num_experts,), -1, dtype=torch.int32)
        expert_map[local.start : local.stop] = torch.arange(len(local), dtype=torch.int32)
        return expert_map.to(self.device)

    def finish(self, ignore: Callable[[str], bool] = lambda name: False) -> None:
        """Raise if the checkpoint holds tensors no layer asked for (bar `ignore`d ones)."""
        elsewhere = tuple(self._other_ranks_experts)
        unexpected = [
            name for name in self.checkpoint.unread() if not ignore(name) and not name.startswith(elsewhere)
        ]
        if unexpected:
            shown = ", ".join(unexpected[:8]) + (f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else "")
            raise CheckpointError(
                f"{self.checkpoint.model_dir}: unexpected tensors the model graph does not use: {shown}; "
                "is config.json for this checkpoint?"
            )

    def _stacked(self, parts: Sequence[torch.Tensor]) -> torch.Tensor:
        """Checkpoint parts stacked along the output dim, in the model dtype on the
        device: each part is converted as it is copied into place, so the weights are
        read and written once (no stacked copy in the checkpoint's dtype first)."""
        if len(parts) == 1:
            return parts[0].to(device=self.device, dtype=self.dtype).contiguous()
        rows = sum(part.shape[0] for part in parts)
        stacked = torch.empty((rows, *parts[0].shape[1:]), dtype=self.dtype, device=self.device)
        start = 0
        for part in parts:
            stacked[start : start + part.shape[0]].copy_(part)
            start += part.shape[0]
        return stacked

    def _local_linear(self, weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
        """This rank's dense weight as a linear: in the model dtype, or fp8 per channel."""
        weight = weight.to(device=self.device, dtype=self.dtype).contiguous()
        if self.quantize_fp8:
            fp8_weight, scale = quantization.quantize_per_channel(self.ops, weight, self.fp8_dtype)
            return quantization.Fp8Linear(self.ops, fp8_weight, scale, "row", bias)
        return DenseLinear(self.ops, weight, bias)

    def _packed(self, name: str, shape: Sequence[int], shard: Shard = WHOLE) -> PackedWeight | None:
        """This rank's `shard` of weight `name` packed (GGUF blocks or group-quantised
        codes) on the device, where the checkpoint keeps it packed; else None, and
        nothing is read."""
        read_packed = getattr(self.checkpoint, "read_packed", None)
        if read_packed is None:
            return None
        self._check(name, shape)
        dim = 0 if shard.whole else shard.dim
        start, stop = (0, shape[0]) if shard.whole else shard.bounds(shape[shard.dim])
        weight = read_packed(name, dim, start, stop)
        return None if weight is None else weight.to(self.device)

    def _packed_layer(
        self, weight: PackedWeight, bias: torch.Tensor | None, out_dtype: torch.dtype | None = None
    ) -> Linear:
        """The linear that computes a packed weight: quant_linear's or group_quant_linear's."""
        if isinstance(weight, quantization.GroupQuantWeight):
            return quantization.GroupQuantLinear(self.ops, weight, bias, out_dtype)
        return quantization.QuantLinear(self.ops, weight, bias, out_dtype)

    def _packed_linear(
        self, prefixes: Sequence[str], packed: Sequence[PackedWeight | None], in_features: int,
        out_features: Sequence[int], shards: Sequence[Shard], biases: torch.Tensor | None,
    ) -> Linear:
        """A fused linear some of whose parts are packed: one packed weight where every
        part is packed alike (rows stack), else each part its own linear."""
        stacked = _stacked_packed(packed)
        if stacked is not None:
            return self._packed_layer(stacked, biases)
        weights = [
            weight if weight is not None else self._read(f"{prefix}.weight", (n, in_features), shard)
            for prefix, weight, n, shard in zip(prefixes, packed, out_features, shards)
        ]
        rows = [weight.shape[0] if isinstance(weight, torch.Tensor) else weight.out_features for weight in weights]
        part_biases = [None] * len(weights) if biases is None else list(biases.split(rows))
        return quantization.ConcatenatedLinear([
            self._local_linear(weight, bias) if isinstance(weight, torch.Tensor) else self._packed_layer(weight, bias)
            for weight, bias in zip(weights, part_biases)
        ])

    def _check(self, name: str, shape: Sequence[int]) -> None:
        """Raise CheckpointError unless the checkpoint holds `name` at `shape`."""
        if name not in self.checkpoint:
            raise CheckpointError(
                f"{self.checkpoint.model_dir}: tensor {name!r} (shape {tuple(shape)}) is missing from the checkpoint"
            )
        stored = self.checkpoint.shape(name)
        if stored != tuple(shape):
            raise CheckpointError(
                f"{self.checkpoint.model_dir}: tensor {name!r} has shape {stored}, but config.json implies "
                f"{tuple(shape)}"
            )

    def _read(self, name: str, shape: Sequence[int], shard: Shard = WHOLE) -> torch.Tensor:
        self._check(name, shape)
        if shard.whole:
            return self.checkpoint.read(name)
        return self.checkpoint.read_slice(name, shard.dim, *shard.bounds(shape[shard.dim]))

    def _device_fp8(self, weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A checkpoint's e4m3fn weight and scale as the device stores them: the backend
        converts at load time where its format differs (e4m3fnuz on gfx94x)."""
        return self.ops.backend.prepare_fp8_weight(weight, scale)  # type: ignore[attr-defined]

    def _block_scale(self, prefix: str, shape: Sequence[int], shard: Shard = WHOLE) -> torch.Tensor:
        """The 128x128 block scales of `prefix.weight`, sliced like the weight's `shard`
        (which must start and end on tile edges, so chunk i of the tiles is chunk i of
        the scales)."""
        rows, cols = shape
        block = quantization.BLOCK
        if not shard.whole:
            extent = shape[shard.dim]
            start, stop = shard.bounds(extent)
            if start % block or (stop % block and stop != extent):
                raise CheckpointError(
                    f"{self.checkpoint.model_dir}: fp8 tensor {prefix}.weight cannot be split for tensor parallel: "
                    f"this rank's slice [{start}:{stop}] of dim {shard.dim} does not fall on {block}-wide scale tiles"
                )
        scale_shape = (-(-rows // block), -(-cols // block))
        return self.tensor(f"{prefix}.weight_scale_inv", scale_shape, torch.float32, shard)

    def _stacked_blocks(
        self, prefixes: Sequence[str], parts: Sequence[torch.Tensor], shapes: Sequence[Sequence[int]],
        shards: Sequence[Shard],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Block-fp8 parts (this rank's shards of weights of full `shapes`) stacked along
        the output dim, with their scales."""
        # Stacking block-scaled parts keeps every 128-row tile inside one part only when
        # each part but the last is a whole number of tiles (true of real checkpoints).
        for prefix, part in zip(prefixes[:-1], parts[:-1]):
            if part.shape[0] % quantization.BLOCK:
                raise CheckpointError(
                    f"{self.checkpoint.model_dir}: fp8 tensor {prefix}.weight has {part.shape[0]} rows on this rank; "
                    f"fusing block-quantised weights needs a multiple of {quantization.BLOCK}"
                )
        scales = [self._block_scale(p, shape, s) for p, shape, s in zip(prefixes, shapes, shards)]
        return torch.cat(parts).to(self.device).contiguous(), torch.cat(scales).contiguous()
