"""accord: one OpenAI-compatible LLM serving engine for NVIDIA, AMD, Ascend and CPUs."""

from __future__ import annotations

from typing import Any

from ._npu_autoload import guard_torch_npu_autoload
from ._openmp_wait import shorten_openmp_spin

# Before anything imports torch: torch-npu without CANN would break `import torch`, and
# libgomp reads its spin count once, when torch loads it.
guard_torch_npu_autoload()
shorten_openmp_spin()

__version__ = "0.1.0"

#: Public names imported on first use, so `import accord` (and the CLI) stays light.
_LAZY = {
    "LLM": "accord.entrypoints",
    "SamplingParams": "accord.core.sampling_params",
    "RequestOutput": "accord.core.outputs",
    "CompletionOutput": "accord.core.outputs",
    "LLMEngine": "accord.entrypoints",
    "AsyncLLM": "accord.entrypoints",
    "LoRARequest": "accord.core.lora.request",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'accord' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
