"""The public entry points (`accord.LLM`, `accord.AsyncLLM`, `accord.LLMEngine`): the
core's classes with the backend looked up by name in the backend registry.

Core never picks a backend; this is where a name (`backend="cpu"`, the `--backend`
flag) becomes one. The lookup travels as a picklable factory, so worker processes
find the same backend in their own registry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backends import Backend, get_backend
from ..core.engine import async_llm, llm, llm_engine
from ..core.worker.contract_ops import worker_contract_ops
from .model_choice import choose_model


@dataclass(frozen=True)
class RegistryBackend:
    """A backend factory: the default registry's backend called `name`, found in
    whichever process calls it. "auto" picks the best available one with a kernel for
    every op a worker serving `model` (with `quantization`, decoding speculatively or
    not, serving LoRA or not) calls, or for every contract when no model is given."""

    name: str = "auto"
    model: str | None = None
    quantization: str | None = None
    speculative: bool = False
    lora: bool = False

    def __call__(self) -> Backend:
        required = None
        if self.name == "auto" and self.model is not None:
            required = worker_contract_ops(self.model, self.quantization, self.speculative, self.lora)
        return get_backend(self.name, required)


class LLMEngine(llm_engine.LLMEngine):
    """`accord.core.engine.llm_engine.LLMEngine` whose `from_engine_args` takes `backend` by name."""

    @classmethod
    def from_engine_args(cls, model: str, **kwargs: Any) -> llm_engine.LLMEngine:  # type: ignore[override]
        """Build from keyword engine arguments (vLLM's names, `backend` a registry name)."""
        backend = RegistryBackend(kwargs.get("backend", "auto"), model, kwargs.get("quantization"),
                                  kwargs.get("speculative_config") is not None, bool(kwargs.get("enable_lora")))
        return llm_engine.LLMEngine.from_engine_args(model, backend, **kwargs)


class LLM(llm.LLM):
    """vLLM's offline API (`LLM(model=..., backend="cpu", tensor_parallel_size=2, ...)`);
    `model` is found as `accord serve` finds it (model_choice), so "accord-demo-random" is
    the built-in random demo model."""

    def __init__(self, model: str, **engine_args: Any) -> None:
        choice = choose_model(model)
        if engine_args.get("kv_cache_memory") is None and choice.kv_cache_memory is not None:
            engine_args["kv_cache_memory"] = choice.kv_cache_memory
        backend = RegistryBackend(engine_args.get("backend", "auto"), str(choice.path), engine_args.get("quantization"),
                                  engine_args.get("speculative_config") is not None, bool(engine_args.get("enable_lora")))
        super().__init__(choice.path, backend, **engine_args)


class AsyncLLM(async_llm.AsyncLLM):
    """The asyncio engine front, with `from_engine_args` taking `backend` by name."""

    @classmethod
    def from_engine_args(cls, model: str, **kwargs: Any) -> AsyncLLM:  # type: ignore[override]
        """Build the engine from keyword engine arguments (as `LLM(...)` takes them)."""
        return cls(LLMEngine.from_engine_args(model, **kwargs))
