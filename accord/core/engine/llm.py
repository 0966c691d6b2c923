"""LLM: vLLM's offline API (`LLM(model=...)`, `generate`, `chat`) over LLMEngine."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

from tqdm.auto import tqdm

from ..device import BackendFactory
from ..lora.request import LoRARequest
from .llm_engine import LLMEngine, PromptType
from .token_budget import OFFLINE_BUDGET
from ..outputs import RequestOutput
from ..sampling_params import SamplingParams
from ..model_loader.tokenizer import Tokenizer

#: A chat conversation: OpenAI-style messages ({"role": ..., "content": ...}).
Conversation = list[dict[str, Any]]


class LLM:
    """Offline batched generation: engine arguments as keyword arguments, with
    vLLM's names (`dtype`, `max_model_len`, `block_size`, `max_num_seqs`,
    `max_num_batched_tokens`, `enable_prefix_caching`, `kv_cache_memory`,
    `tensor_parallel_size`, `data_parallel_size`, `enable_expert_parallel`,
    `distributed_executor_backend`, ...), on the backend
    `backend_factory` builds (`accord.LLM` finds it by name). Without
    `max_num_batched_tokens` a step takes up to OFFLINE_BUDGET tokens (vLLM-CPU's 4096),
    not the engine's latency-bound measured budget."""

    def __init__(self, model: str, backend_factory: BackendFactory, **engine_args: Any) -> None:
        if engine_args.get("max_num_batched_tokens") is None:
            # Throughput, not inter-token latency, is what an offline batch is for: no
            # measured latency-bound budget (the engine's default for serving).
            engine_args["max_num_batched_tokens"] = OFFLINE_BUDGET
        self.llm_engine = LLMEngine.from_engine_args(model, backend_factory, **engine_args)
        self._request_counter = itertools.count()

    def get_tokenizer(self) -> Tokenizer:
        """The model's tokenizer."""
        return self.llm_engine.tokenizer

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
        lora_request: LoRARequest | Sequence[LoRARequest | None] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (a string or `{"prompt_token_ids": [...]}`), with
        one SamplingParams for all or one per prompt, and one LoRA adapter for all or
        one (or None: the base model) per prompt; results in prompt order."""
        prompt_list = _prompt_list(prompts)
        if sampling_params is None:
            sampling_params = SamplingParams()
        params_list = (
            [sampling_params] * len(prompt_list)
            if isinstance(sampling_params, SamplingParams)
            else list(sampling_params)
        )
        if len(params_list) != len(prompt_list):
            raise ValueError(
                f"got {len(params_list)} sampling params for {len(prompt_list)} prompts; pass one or one per prompt"
            )
        if priority is not None and len(priority) != len(prompt_list):
            raise ValueError(f"got {len(priority)} priorities for {len(prompt_list)} prompts")
        loras = (
            list(lora_request) if isinstance(lora_request, Sequence) else [lora_request] * len(prompt_list)
        )
        if len(loras) != len(prompt_list):
            raise ValueError(f"got {len(loras)} LoRA requests for {len(prompt_list)} prompts; pass one or one per prompt")
        request_ids: list[str] = []
        try:
            for index, (prompt, params) in enumerate(zip(prompt_list, params_list)):
                request_id = str(next(self._request_counter))
                self.llm_engine.add_request(
                    request_id, prompt, params, priority=priority[index] if priority else 0, lora_request=loras[index]
                )
                request_ids.append(request_id)
        except BaseException:
            # A bad prompt midway: the ones already queued must not run in the next call.
            self.llm_engine.abort_request(request_ids)
            raise
        return self._run_engine(request_ids, use_tqdm)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """Apply the model's chat template to each conversation, then generate."""
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        tokenizer = self.llm_engine.tokenizer
        prompts: list[PromptType] = []
        for conversation in conversations:
            text = tokenizer.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt)
            # The rendered prompt rides along, so outputs carry it (as vLLM's do); the
            # ids are encoded without special tokens: the template wrote them.
            prompts.append({"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        with tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm, dynamic_ncols=True) as bar:
            while engine.has_unfinished_requests():
                # Only finished requests' outputs are read: none is built for the others.
                for output in engine.step(final_only=True):
                    if output.finished:
                        finished[output.request_id] = output
                        bar.update(1)
        return [finished[request_id] for request_id in request_ids]


def _prompt_list(prompts: PromptType | Sequence[PromptType] | Sequence[int]) -> list[PromptType]:
    """The prompts of a `generate` call: one prompt (text, a dict, or a plain list of
    token ids, as vLLM takes it) or a list of them."""
    if isinstance(prompts, (str, dict)):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(item, int) and not isinstance(item, bool) for item in items):
        return [{"prompt_token_ids": items}]
    for item in items:
        if not isinstance(item, (str, dict)):
            raise ValueError(
                f"a prompt is a string, a dict with 'prompt_token_ids' or 'prompt', or a list of token ids; "
                f"got a list holding {type(item).__name__}"
            )
    return items  # type: ignore[return-value]
