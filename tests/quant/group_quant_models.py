"""The tiny Llama pairs the group-quantised loading tests compare: one checkpoint with
its projections stored packed in a format, one with the same codes dequantised, both
run by accord on the cpu backend in fp32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file
from single_sequence import SingleSequenceRunner
from tiny_models import build_tiny_model, fixed_prompt

from accord.backends import get_backend
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher

#: Wide enough for 128-channel groups (compressed-tensors needs K a multiple of them).
WIDE = dict(hidden_size=128, intermediate_size=256)
NEW_TOKENS = 16
#: A quantiser: one projection's weight [N, K] -> (its stored tensors by suffix, the
#: dequantised weight those tensors stand for).
Quantiser = Callable[[torch.Tensor], tuple[dict[str, torch.Tensor], torch.Tensor]]


def save_tiny_llama(directory: Path) -> Path:
    """The tiny random Llama, widened, in fp32."""
    build_tiny_model("llama", **WIDE).save_pretrained(directory)
    return directory


def is_quantised(name: str) -> bool:
    """The projections AutoAWQ, AutoGPTQ and llm-compressor's W4A16 recipe quantise
    (never embeddings, norms or the head)."""
    return name.startswith("model.layers.") and name.endswith("proj.weight")


def write_pair(source: Path, packed: Path, dense: Path, quantiser: Quantiser, quant_config: dict[str, Any]) -> None:
    """`source` with each projection stored as `quantiser` packs it in `packed` (its
    config.json declaring `quant_config`), and dequantised in `dense`; the source's
    other files (tokenizer, generation config) copied to both."""
    packed_tensors, dense_tensors = {}, {}
    for name, tensor in load_file(source / "model.safetensors").items():
        if not is_quantised(name):
            packed_tensors[name] = dense_tensors[name] = tensor
            continue
        stored, dense_tensors[name] = quantiser(tensor)
        prefix = name.removesuffix(".weight")
        packed_tensors.update({f"{prefix}.{part}": value for part, value in stored.items()})
    config = json.loads((source / "config.json").read_text())
    kept = [path for path in source.iterdir() if path.name not in ("model.safetensors", "config.json")]
    for directory, tensors, extra in (
        (packed, packed_tensors, {"quantization_config": quant_config}), (dense, dense_tensors, {}),
    ):
        directory.mkdir(exist_ok=True)
        for path in kept:  # the tokenizer and generation config, where the source has them
            shutil.copy(path, directory / path.name)
        save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
        (directory / "config.json").write_text(json.dumps({**config, **extra}))


def generate(directory: Path) -> tuple[torch.Tensor, list[int], Any]:
    """(prompt logits, greedy tokens, the model) of accord on the cpu backend in fp32."""
    loaded = load_model(directory, OpDispatcher(get_backend("cpu")), dtype="float32")
    runner = SingleSequenceRunner(loaded.model, len(fixed_prompt()) + NEW_TOKENS)
    logits, tokens = runner.generate(fixed_prompt(), NEW_TOKENS)
    return logits, tokens, loaded.model


def relative_gap(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """The largest logit difference over the reference's largest magnitude."""
    return float((logits - reference).abs().max() / reference.abs().max())
