"""EngineClient: what the server (and anything else serving requests) may ask of the
engine, and nothing below it. `AsyncLLM` is the one implementation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

from ..lora.request import LoRARequest
from ..model_loader.model_config import ModelConfig
from ..model_loader.tokenizer import Tokenizer
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from ..stats import EngineStats
from .llm_engine import PromptType


class EngineClient(Protocol):
    """A running engine as a server sees it: generate and abort requests, its model's
    facts, its gauges, and whether it is alive."""

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer (encode, decode, apply_chat_template)."""
        ...

    @property
    def model_config(self) -> ModelConfig:
        """The model's parsed config."""
        ...

    @property
    def max_model_len(self) -> int:
        """The longest prompt plus output the engine accepts."""
        ...

    @property
    def errored(self) -> bool:
        """Whether the engine is dead (requests fail with EngineDeadError)."""
        ...

    @property
    def num_allocated_blocks(self) -> int:
        """KV blocks currently referenced by some request."""
        ...

    def generate(
        self, prompt: PromptType, sampling_params: SamplingParams, request_id: str, priority: int = 0,
        lora_request: LoRARequest | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Add a request (under `lora_request`'s adapter, if given) and stream its
        cumulative outputs until it finishes."""
        ...

    def add_lora(self, lora_request: LoRARequest) -> bool:
        """Check a LoRA adapter so requests may name it (blocking: it reads the
        adapter); ValueError naming what is wrong with it."""
        ...

    def remove_lora(self, lora_int_id: int) -> bool:
        """Forget a LoRA adapter; whether it was known."""
        ...

    async def reset_prefix_cache(self) -> int:
        """Empty the prefix cache of the blocks no running request holds; how many left it."""
        ...

    async def abort(self, request_id: str) -> None:
        """Stop a request; its stream ends with finish_reason "abort"."""
        ...

    def get_stats(self) -> EngineStats:
        """A snapshot of the engine's gauges and counters."""
        ...

    def get_replica_stats(self) -> list[EngineStats]:
        """A snapshot of each data-parallel replica's gauges and counters."""
        ...

    def watch_engine(self) -> None:
        """Hear of the engine's death between steps too (call from the serving loop)."""
        ...

    async def shutdown(self) -> None:
        """Stop serving requests."""
        ...
