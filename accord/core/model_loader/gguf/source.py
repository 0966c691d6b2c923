"""A GGUF file opened as a model source (config, generation config, tensors)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ....op_contracts import GGUF_FORMATS
from .checkpoint import GgufCheckpoint
from .config import hf_config
from .reader import open_gguf

#: Set to 0 to dequantise GGUF linear weights at load into the compute dtype, rather than
#: keep them packed and compute them with quant_linear (the default). Packed holds about
#: the file's bytes instead of fp32's 7-8x; its row dot streams them at batch 1, and its
#: token-tile GEMM beats the fp32 GEMM of the dequantised weights 2.0-2.3x from 16 to
#: 2048 rows (docs/quantization.md, benchmarks/quant_gguf_cpu.py). It computes with int8
#: activations per 32, as llama.cpp does, where the dequantised path computes what
#: transformers does on the same file.
PACKED_ENV = "ACCORD_GGUF_PACKED"
#: The first part of the names of the tensors that load packed: the decoder layers'
#: matrices, the LM head's (`output`), and the token embedding's (`token_embd`, which a
#: tied head shares).
PACKED_TABLES = frozenset({"blk", "output", "token_embd"})


def keeps_packed() -> bool:
    """Whether GGUF linear weights load packed (the default) rather than dequantised
    (ACCORD_GGUF_PACKED=0)."""
    return os.environ.get(PACKED_ENV, "1") != "0"


@dataclass(frozen=True)
class GgufSource:
    """What load_model reads from a GGUF file: config.json and generation_config.json
    equivalents, and the tensors."""

    config: dict[str, Any]
    generation: dict[str, Any]
    checkpoint: GgufCheckpoint


def open_gguf_model(path: str | Path) -> GgufSource:
    """The model in the GGUF file at `path`, or GgufError naming what is unsupported."""
    file = open_gguf(path)
    config, generation = hf_config(file)
    checkpoint = GgufCheckpoint(
        file, config["num_attention_heads"], config["num_key_value_heads"], keep_packed=keeps_packed()
    )
    return GgufSource(config, generation, checkpoint)


def packed_tables(path: str | Path) -> frozenset[str]:
    """Which of `PACKED_TABLES` loading the GGUF file at `path` keeps packed (some
    matrix of it in a format quant_linear computes); empty where packing is off."""
    if not keeps_packed():
        return frozenset()
    return frozenset(
        table
        for t in open_gguf(path).tensors()
        if (table := t.name.split(".")[0]) in PACKED_TABLES and len(t.shape) == 2 and t.tensor_type.name in GGUF_FORMATS
    )
