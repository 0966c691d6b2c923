"""`load_model`, the one entry point the workers call: read the model's config from
its source, pick the graph, load the tensors into it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, get_args

import torch

from ...op_contracts import OpDispatcher
from ..config import Quantization
from ..distributed import ParallelContext
from ..models.causal_lm import CausalLM
from ..models.registry import check_supported, family, parse_model_config
from ..models.weights import WeightLoader
from .group_quant.checkpoint import GroupQuantCheckpoint
from .model_config import DTYPES_BY_NAME, ModelConfig
from .source import model_source

#: What `quantization` may be: none, or a method EngineConfig names.
QUANTIZATIONS = (None, *get_args(Quantization))


@dataclass(frozen=True)
class LoadedModel:
    """A model ready to run, with its parsed config (`config.dtype` is the dtype it runs in)."""

    model: CausalLM
    config: ModelConfig
    #: The checkpoint's multi-token-prediction layer, when asked for (`with_mtp`).
    mtp: Any = None


def load_model(
    model_dir: str | Path,
    ops: OpDispatcher,
    dtype: torch.dtype | str = "auto",
    quantization: str | None = None,
    compute_dtype: Callable[[torch.dtype], torch.dtype] | None = None,
    parallel: ParallelContext | None = None,
    with_mtp: bool = False,
) -> LoadedModel:
    """Load a Hugging Face model directory (or a GGUF file) onto `ops`'s backend.

    `dtype` "auto" takes config.json's dtype; the result goes through `compute_dtype`
    (the backend's, e.g. bf16 -> fp32 on CPUs without bf16 GEMMs). `quantization`
    "fp8" quantises dense weights at load; block-fp8 checkpoints stay fp8 regardless.
    `parallel` (one rank when None) says which tensor-parallel shard this rank loads.
    `with_mtp` also loads the checkpoint's MTP layer (DeepSeek-V3), refused where the
    architecture or the checkpoint has none.
    """
    parallel = parallel or ParallelContext.single()
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"quantization {quantization!r} is not supported; choose from {list(QUANTIZATIONS)}")
    source = model_source(model_dir)
    raw, generation = source.configs()
    # An unknown architecture is the error to report, not missing weights.
    architecture = check_supported(raw)
    checkpoint = source.checkpoint()
    builder = family(architecture)
    config = builder.parse_config(raw, ModelConfig.from_hf(raw, generation))
    run_dtype = _resolve_dtype(dtype, config.dtype)
    if compute_dtype is not None:
        run_dtype = compute_dtype(run_dtype)
    config = dataclasses.replace(config, dtype=run_dtype)
    if parallel.tp_size > 1 and not builder.tensor_parallel:
        raise ValueError(
            f"{architecture} has no tensor-parallel graph yet; load it with tensor_parallel_size=1 "
            f"(got {parallel.tp_size})"
        )
    if config.group_quant is not None:
        checkpoint = GroupQuantCheckpoint(checkpoint, config.group_quant)  # type: ignore[arg-type]
    weights = WeightLoader(
        checkpoint, ops, run_dtype, torch.device(ops.backend.device_type),
        quantize_fp8=quantization == "fp8", parallel=parallel,
    )
    model = builder.load(weights, config)
    mtp = None
    if with_mtp:
        if builder.load_mtp is None or not config.num_nextn_predict_layers:
            raise ValueError(
                f"speculative_config.method 'mtp' needs a checkpoint with MTP layers; {architecture} at "
                f"{model_dir} has none (num_nextn_predict_layers is {config.num_nextn_predict_layers})"
            )
        mtp = builder.load_mtp(weights, config, model)
    weights.finish(lambda name: builder.ignores(name, config))
    return LoadedModel(model, config, mtp)


def read_model_config(model_dir: str | Path) -> ModelConfig:
    """The parsed config of a Hugging Face model directory or GGUF file, without its
    weights (the engine checks the parallel layout against it before starting workers)."""
    return parse_model_config(*model_source(model_dir).configs())


def _resolve_dtype(dtype: torch.dtype | str, checkpoint: torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return checkpoint
    if dtype not in DTYPES_BY_NAME:
        raise ValueError(f"dtype {dtype!r} is not supported; choose auto or one of {sorted(DTYPES_BY_NAME)}")
    return DTYPES_BY_NAME[dtype]

