"""Which graph builds which `architectures[0]` of config.json. Family modules are
imported only when their architecture is asked for; anything else is refused with the
list of supported architectures."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping

from ..model_loader.model_config import ModelConfig
from .causal_lm import CausalLM
from .contract_ops import decoder_ops
from .weights import WeightLoader

#: architecture -> module (under accord.core.models) holding its `build_layer` (or, for
#: a graph that is not the shared decoder skeleton, `load(weights, config)`), and
#: optionally `is_unused_tensor(name, config)` for tensors it knowingly leaves unread and
#: `parse_config(raw, config)` for config.json fields of its own, and `contract_ops(config)`
#: where its graph calls other ops than the decoder skeleton's (contract_ops.py).
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "llama",
    "Qwen3ForCausalLM": "llama",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "mixtral",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV4ForCausalLM": "deepseek_v4",
}
#: architecture -> module whose `MtpLayer.load(weights, config, target)` loads the
#: checkpoint's multi-token-prediction layer (speculative_config method "mtp").
MTP_LAYERS = {"DeepseekV3ForCausalLM": "deepseek_mtp"}


class UnsupportedArchitectureError(ValueError):
    """config.json names an architecture no graph here implements."""


@dataclass(frozen=True)
class ModelFamily:
    """How to build one architecture: the model from the checkpoint, and which
    checkpoint tensors it knowingly leaves unread."""

    load: Callable[[WeightLoader, ModelConfig], Any]
    ignores: Callable[[str, ModelConfig], bool]
    #: Whether its graph shards across tensor-parallel ranks (module `TENSOR_PARALLEL`).
    tensor_parallel: bool
    #: Adds the family's own config.json fields to the generic ModelConfig.
    parse_config: Callable[[Mapping[str, Any], ModelConfig], ModelConfig]
    #: The op contracts its graph calls for a config (what a backend must implement).
    contract_ops: Callable[[ModelConfig], frozenset[str]]
    #: Loads its MTP layer onto a loaded target: (weights, config, target); None: it has none.
    load_mtp: Callable[[WeightLoader, ModelConfig, CausalLM], Any] | None = None


def supported_architectures() -> list[str]:
    """Every architecture name load_model accepts, sorted."""
    return sorted(ARCHITECTURES)


def check_supported(raw_config: Mapping[str, Any]) -> str:
    """The architecture of a config.json dict, or UnsupportedArchitectureError saying why
    not (remote-code models are refused: their code is never run)."""
    architecture = (raw_config.get("architectures") or ["<none>"])[0]
    if architecture in ARCHITECTURES:
        return architecture
    remote = " It ships its own modeling code (auto_map), which is never run." if raw_config.get("auto_map") else ""
    raise UnsupportedArchitectureError(
        f"Unsupported architecture: {architecture}.{remote} Supported items: {supported_architectures()}"
    )


def family(architecture: str) -> ModelFamily:
    """The family that builds `architecture` (checked with check_supported first)."""
    module = importlib.import_module(f".{ARCHITECTURES[architecture]}", __package__)
    family_ignores = getattr(module, "is_unused_tensor", None)

    def ignores(name: str, config: ModelConfig) -> bool:
        # Tied checkpoints may still carry a copy of the head; old ones carry rope buffers.
        if name == "lm_head.weight" and config.tie_word_embeddings:
            return True
        if name.endswith("rotary_emb.inv_freq"):
            return True
        return family_ignores is not None and family_ignores(name, config)

    load = getattr(module, "load", None) or partial(CausalLM.load, build_layer=module.build_layer)
    own_fields = getattr(module, "parse_config", None) or (lambda raw, config: config)
    ops = getattr(module, "contract_ops", decoder_ops)
    load_mtp = None
    if architecture in MTP_LAYERS:
        load_mtp = importlib.import_module(f".{MTP_LAYERS[architecture]}", __package__).MtpLayer.load
    return ModelFamily(load, ignores, getattr(module, "TENSOR_PARALLEL", False), own_fields, ops, load_mtp)


def parse_model_config(raw: Mapping[str, Any], generation: Mapping[str, Any] | None = None) -> ModelConfig:
    """config.json (and generation_config.json) of a supported architecture parsed: the
    generic fields, then the family's own."""
    architecture = check_supported(raw)
    return family(architecture).parse_config(raw, ModelConfig.from_hf(raw, generation))
