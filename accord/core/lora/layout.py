"""Where PEFT's target modules live in accord's graphs: q/k/v_proj are slices of one fused
qkv projection, gate/up_proj of one fused gate_up projection, o_proj and down_proj are
projections of their own. An adapter's tensors are checked against these shapes at load,
and each projection's device slots hold every slice's A and B side by side.

Under tensor parallelism a rank's slots hold its part of each adapter, cut the way the
base layer is (vLLM's punica wrapper does the same): a column-parallel module (q/k/v by
heads, gate/up by channels) keeps its output rows of B and all of A; a row-parallel one
(o_proj, down_proj) keeps its input columns of A and all of B, so each rank adds
(x_rank @ A_rank^T) @ B to its partial product and the layer's all-reduce sums the
shrink over the ranks with the base GEMM, with no collective of its own."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..distributed import ParallelContext
from ..distributed.sharding import WHOLE, Shard, head_shards, split_evenly
from ..model_loader.model_config import ModelConfig


@dataclass(frozen=True)
class ModuleShape:
    """One PEFT target module: its projection in accord's graph, its slice index there,
    its (in_features, out_features) in the unsharded model, and the part of its input
    columns and output rows this tensor-parallel rank holds."""

    projection: str
    slice_index: int
    in_features: int
    out_features: int
    in_shard: Shard = WHOLE
    out_shard: Shard = WHOLE

    @property
    def local_in(self) -> tuple[int, int]:
        """[start, stop) of the input features (A's columns) this rank holds."""
        return self.in_shard.bounds(self.in_features)

    @property
    def local_out(self) -> tuple[int, int]:
        """[start, stop) of the output features (B's rows) this rank holds."""
        return self.out_shard.bounds(self.out_features)


#: accord's projection -> the PEFT modules stacked in it, in the graph's output order.
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o_proj": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down_proj": ("down_proj",),
}

#: Modules whose LoRA accord does not serve, with the reason an adapter naming them gets.
REFUSED_MODULES = {
    "lm_head": "LoRA on lm_head is not supported (only the decoder layers' projections)",
    "embed_tokens": "LoRA on the token embedding is not supported (only the decoder layers' projections)",
}


@dataclass(frozen=True)
class LoRALayout:
    """The target modules a model serves adapters on, with their shapes, per decoder layer."""

    num_layers: int
    modules: dict[str, ModuleShape]

    @classmethod
    def of(cls, config: ModelConfig, parallel: ParallelContext | None = None) -> LoRALayout:
        """The layout of a dense GQA model (Llama, Qwen2/3), with each module's part on
        `parallel`'s rank (the whole model without one); a mixture-of-experts model
        serves LoRA on its attention only (its feed-forward is routed experts)."""
        hidden, q_size = config.hidden_size, config.num_heads * config.head_dim
        kv_size, inter = config.num_kv_heads * config.head_dim, config.intermediate_size
        shapes = {
            "q_proj": (hidden, q_size), "k_proj": (hidden, kv_size), "v_proj": (hidden, kv_size),
            "o_proj": (q_size, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
            "down_proj": (inter, hidden),
        }
        projections = dict(PROJECTIONS)
        if config.moe is not None:
            projections = {name: PROJECTIONS[name] for name in ("qkv", "o_proj")}
        shards = _rank_shards(config, parallel) if parallel is not None and parallel.tp_size > 1 else {}
        modules = {
            module: ModuleShape(projection, index, *shapes[module], *shards.get(module, (WHOLE, WHOLE)))
            for projection, members in projections.items()
            for index, module in enumerate(members)
        }
        return cls(config.num_layers, modules)

    def slice_widths(self, projection: str) -> list[int]:
        """The output width this rank holds of each slice of `projection`, in order."""
        return [_width(self.modules[module].local_out) for module in PROJECTIONS[projection]]

    def local_in_features(self, projection: str) -> int:
        """The input width this rank holds of `projection`."""
        return _width(self.modules[PROJECTIONS[projection][0]].local_in)

    @property
    def projections(self) -> list[str]:
        """The projections this layout has, in PROJECTIONS order."""
        present = {shape.projection for shape in self.modules.values()}
        return [name for name in PROJECTIONS if name in present]


def _width(bounds: tuple[int, int]) -> int:
    return bounds[1] - bounds[0]


def _rank_shards(config: ModelConfig, parallel: ParallelContext) -> dict[str, tuple[Shard, Shard]]:
    """(input shard, output shard) of each module on this rank, as the model's layers
    cut the base weights (GQAAttention.load, GatedMLP.load)."""
    q_shard, kv_shard = head_shards(parallel, config.num_heads, config.num_kv_heads)
    shards = {"q_proj": (WHOLE, q_shard), "k_proj": (WHOLE, kv_shard), "v_proj": (WHOLE, kv_shard),
              "o_proj": (replace(q_shard, dim=1), WHOLE)}
    if config.moe is None:
        channels = split_evenly(parallel, config.intermediate_size, "intermediate size")
        shards |= {"gate_proj": (WHOLE, channels), "up_proj": (WHOLE, channels),
                   "down_proj": (replace(channels, dim=1), WHOLE)}
    return shards
