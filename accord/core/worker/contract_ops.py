"""The op contracts a worker calls for a model: its graph's (the family's answer, from
config.json alone), the fp8 linears when weights are quantised at load, the packed
linears and embedding of a GGUF file, the sampler's, and the rejection sampler's when decoding
speculatively. `--backend auto` asks a backend for these and no others."""

from __future__ import annotations

from pathlib import Path
from typing import Collection

from ...op_contracts.dispatcher import KernelProvider

from ..model_loader import gguf
from ..model_loader.load import read_model_config
from ..models.contract_ops import FP8_LINEAR, QUANT_EMBEDDING, QUANT_LINEAR
from ..models.registry import family

#: What the sampler calls every step.
SAMPLER_OPS = frozenset({"sample"})
#: What a step with draft tokens adds (the drafts are checked against the target).
SPEC_DECODE_OPS = frozenset({"rejection_sample"})
#: What serving LoRA adapters adds (each token's adapter delta).
LORA_OPS = frozenset({"lora_linear"})


def worker_contract_ops(
    model: str | Path, quantization: str | None = None, speculative: bool = False, lora: bool = False
) -> frozenset[str]:
    """The op contracts a worker serving `model` (a Hugging Face directory or a GGUF
    file) with `quantization`, speculative decoding and LoRA on or off, calls."""
    config = read_model_config(model)
    ops = family(config.architecture).contract_ops(config) | SAMPLER_OPS
    if quantization == "fp8":
        ops |= FP8_LINEAR
    packed = gguf.packed_tables(model) if gguf.is_gguf(model) else frozenset()
    # A head tied to the embedding computes the embedding's blocks.
    if packed & {"blk", "output"} or ("token_embd" in packed and config.tie_word_embeddings):
        ops |= QUANT_LINEAR
    if "token_embd" in packed:
        ops |= QUANT_EMBEDDING
    if lora:
        ops |= LORA_OPS
    return ops | SPEC_DECODE_OPS if speculative else ops


def refuse_batch_variant_ops(backend: KernelProvider, ops: Collection[str]) -> None:
    """Raise ValueError naming every op of `ops` for which `backend` has no kernel
    `--batch-invariant` may run (`Backend.kernel_for(op, batch_invariant=True)`)."""
    missing = sorted(op for op in ops if backend.kernel_for(op, batch_invariant=True) is None)
    if missing:
        raise ValueError(
            f"--batch-invariant: backend {backend.name!r} has no batch-invariant kernel for {', '.join(missing)} "
            "(the model calls them, and the backend declares its kernels batch-variant); turn --batch-invariant "
            "off or use a backend that registers batch-invariant variants"
        )
