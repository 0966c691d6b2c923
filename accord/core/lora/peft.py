"""Reading a PEFT LoRA directory (`adapter_config.json` + `adapter_model.safetensors`)
into checked, scaled tensors. Everything accord does not serve is refused by name, so an
adapter never runs half-applied: DoRA, `modules_to_save`, LoRA on lm_head or the
embedding, per-module rank or alpha patterns, trained biases, and pickled weights.

The scaling is folded into B once, here: alpha / r, or alpha / sqrt(r) with rsLoRA."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .layout import REFUSED_MODULES, LoRALayout
from .request import LoRARequest

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

#: A LoRA tensor of a decoder layer's projection, as PEFT saves it.
TENSOR_NAME = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")


class LoRAAdapterError(ValueError):
    """An adapter that cannot be served, with what is wrong (the server's 400)."""


@dataclass(frozen=True)
class LoRAAdapter:
    """One adapter's tensors on the host, by (layer, PEFT module): A [r, in] and B
    [out, r] with the scaling folded into B, both fp32."""

    request: LoRARequest
    rank: int
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]

    @property
    def modules(self) -> set[str]:
        """The PEFT modules the adapter targets."""
        return {module for _, module in self.weights}


def read_adapter(request: LoRARequest, layout: LoRALayout, max_rank: int) -> LoRAAdapter:
    """The adapter at `request.lora_path`, checked against the model's `layout` and the
    largest rank the slots hold; LoRAAdapterError names the file, setting or tensor at fault."""
    directory = Path(request.lora_path)
    where = f"LoRA adapter {request.lora_name!r} ({directory})"
    config = _read_config(directory, where)
    rank = config.get("r")
    if not isinstance(rank, int) or rank < 1:
        raise LoRAAdapterError(f"{where}: adapter_config.json's r must be a positive integer, got {rank!r}")
    if rank > max_rank:
        raise LoRAAdapterError(f"{where}: rank {rank} exceeds --max-lora-rank {max_rank}")
    alpha = config.get("lora_alpha", rank)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    weights_path = directory / WEIGHTS_FILE
    if not weights_path.is_file():
        found = " (adapter_model.bin is a pickle, which accord never loads)" if (directory / "adapter_model.bin").exists() else ""
        raise LoRAAdapterError(f"{where}: {WEIGHTS_FILE} is missing{found}")
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    with safe_open(str(weights_path), framework="pt") as tensors:
        for name in tensors.keys():
            key, which = _parse_name(name, layout, where)
            pairs.setdefault(key, {})[which] = tensors.get_tensor(name)
    if not pairs:
        raise LoRAAdapterError(f"{where}: {WEIGHTS_FILE} holds no LoRA tensors")
    weights = {}
    for (layer, module), pair in sorted(pairs.items()):
        prefix = f"base_model.model.model.layers.{layer}.*.{module}"
        if set(pair) != {"A", "B"}:
            missing = ({"A", "B"} - set(pair)).pop()
            raise LoRAAdapterError(f"{where}: {prefix}.lora_{missing}.weight is missing")
        shape = layout.modules[module]
        for which, want in (("A", (rank, shape.in_features)), ("B", (shape.out_features, rank))):
            got = tuple(pair[which].shape)
            if got != want:
                raise LoRAAdapterError(
                    f"{where}: tensor {prefix}.lora_{which}.weight has shape {got}, but this model's {module} with "
                    f"rank {rank} takes {want}; is the adapter for another base model?"
                )
        weights[(layer, module)] = (pair["A"].float(), pair["B"].float() * scaling)
    return LoRAAdapter(request, rank, weights)


def _read_config(directory: Path, where: str) -> dict:
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise LoRAAdapterError(f"{where}: {CONFIG_FILE} is missing")
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise LoRAAdapterError(f"{where}: {CONFIG_FILE} is not readable JSON: {error}") from error
    if config.get("peft_type", "LORA") != "LORA":
        raise LoRAAdapterError(f"{where}: peft_type {config['peft_type']!r} is not LORA")
    refusals = {
        "use_dora": "DoRA (use_dora) is not supported",
        "modules_to_save": "modules_to_save (fully trained modules beside the LoRA) is not supported",
        "rank_pattern": "per-module ranks (rank_pattern) are not supported",
        "alpha_pattern": "per-module alphas (alpha_pattern) are not supported",
        "fan_in_fan_out": "fan_in_fan_out (Conv1D-style weights) is not supported",
        "layers_pattern": "layers_pattern is not supported",
    }
    for key, reason in refusals.items():
        if config.get(key):
            raise LoRAAdapterError(f"{where}: {reason}")
    if config.get("bias", "none") != "none":
        raise LoRAAdapterError(f"{where}: trained biases (bias={config['bias']!r}) are not supported")
    targets = config.get("target_modules") or []
    for module in [targets] if isinstance(targets, str) else targets:
        if module in REFUSED_MODULES:
            raise LoRAAdapterError(f"{where}: {REFUSED_MODULES[module]}")
    return config


def _parse_name(name: str, layout: LoRALayout, where: str) -> tuple[tuple[int, str], str]:
    """((layer, module), "A" or "B") of a PEFT tensor name; refuses any other tensor."""
    match = TENSOR_NAME.match(name)
    if match is None:
        for module, reason in REFUSED_MODULES.items():
            if f".{module}." in name:
                raise LoRAAdapterError(f"{where}: tensor {name}: {reason}")
        raise LoRAAdapterError(f"{where}: tensor {name} is not a LoRA A/B matrix of a decoder layer projection")
    layer, module, which = int(match[1]), match[2], match[3]
    if module not in layout.modules:
        served = ", ".join(layout.modules)
        raise LoRAAdapterError(f"{where}: tensor {name} targets {module}, which this model serves no LoRA on ({served})")
    if layer >= layout.num_layers:
        raise LoRAAdapterError(f"{where}: tensor {name} is for layer {layer}, but the model has {layout.num_layers}")
    return (layer, module), which
