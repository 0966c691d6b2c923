"""Where PEFT's target modules live in accord's graphs: q/k/v_proj are slices of one fused
qkv projection, gate/up_proj of one fused gate_up projection, o_proj and down_proj are
projections of their own. An adapter's tensors are checked against these shapes at load,
and each projection's device slots hold every slice's A and B side by side."""

from __future__ import annotations

from dataclasses import dataclass

from ..model_loader.model_config import ModelConfig


@dataclass(frozen=True)
class ModuleShape:
    """One PEFT target module: its projection in accord's graph, its slice index there,
    and its (in_features, out_features) in the unsharded model."""

    projection: str
    slice_index: int
    in_features: int
    out_features: int


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
    def of(cls, config: ModelConfig) -> LoRALayout:
        """The layout of a dense GQA model (Llama, Qwen2/3); a mixture-of-experts model
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
        modules = {
            module: ModuleShape(projection, index, *shapes[module])
            for projection, members in projections.items()
            for index, module in enumerate(members)
        }
        return cls(config.num_layers, modules)

    def slice_widths(self, projection: str) -> list[int]:
        """The output width of each slice of `projection`, in order."""
        return [self.modules[module].out_features for module in PROJECTIONS[projection]]

    @property
    def projections(self) -> list[str]:
        """The projections this layout has, in PROJECTIONS order."""
        present = {shape.projection for shape in self.modules.values()}
        return [name for name in PROJECTIONS if name in present]
