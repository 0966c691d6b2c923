"""The runner's persistent batch (vLLM's InputBatch): every running request's tokens
and block table in preallocated rows, so a step's inputs are gathered with tensor
indexing instead of rebuilt from Python lists, and a step's scheduler output only
needs to carry diffs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..sampling_params import SamplingParams
from ..sched.output import CachedRequestData, NewRequestData

#: Token and block ids are held as int32 (a vocabulary and a block pool fit; half the
#: memory of int64: the token rows are max_num_seqs x max_model_len).
TOKEN_DTYPE = torch.int32


@dataclass
class CachedRequestState:
    """What the runner knows of one running request: its row in the batch, its tokens,
    sampling settings and progress (it has the attributes the sampler reads)."""

    req_id: str
    row: int
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    num_computed_tokens: int
    num_blocks: int
    num_prompt_logprobs: int | None
    #: Prompt positions that have their logprob entry (the first, predicted by nothing, counts).
    num_prompt_logprobs_done: int
    #: The LoRA adapter it runs under, 0 for the base model.
    lora_int_id: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def needs_prompt_logprobs(self) -> bool:
        return self.num_prompt_logprobs is not None and self.num_prompt_logprobs_done < self.num_prompt_tokens


class InputBatch:
    """Rows of token ids and block tables for up to `max_num_reqs` running requests."""

    def __init__(self, max_num_reqs: int, max_model_len: int, max_blocks_per_req: int) -> None:
        self.token_ids = torch.zeros(max_num_reqs, max_model_len, dtype=TOKEN_DTYPE)
        self.block_table = torch.zeros(max_num_reqs, max_blocks_per_req, dtype=TOKEN_DTYPE)
        # numpy views of the same memory: a step's inputs are gathered from these.
        self.token_ids_np = self.token_ids.numpy()
        self.block_table_np = self.block_table.numpy()
        self.requests: dict[str, CachedRequestState] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

    def add(self, new: NewRequestData) -> None:
        """Take a row for a newly admitted (or resumed) request."""
        if not self._free_rows:
            raise RuntimeError(f"the persistent batch is full ({len(self.requests)} requests)")
        row = self._free_rows.pop()
        tokens = new.prompt_token_ids + new.output_token_ids
        self.token_ids_np[row, : len(tokens)] = tokens
        self.block_table_np[row, : len(new.block_ids)] = new.block_ids
        self.requests[new.req_id] = CachedRequestState(
            req_id=new.req_id,
            row=row,
            prompt_token_ids=list(new.prompt_token_ids),
            output_token_ids=list(new.output_token_ids),
            params=new.sampling_params,
            num_computed_tokens=new.num_computed_tokens,
            num_blocks=len(new.block_ids),
            num_prompt_logprobs=new.num_prompt_logprobs,
            num_prompt_logprobs_done=new.num_prompt_logprobs_done,
            lora_int_id=new.lora_request.lora_int_id if new.lora_request else 0,
        )

    def update(self, cached: CachedRequestData) -> None:
        """Apply the diffs of requests the batch already holds."""
        for req_id, new_blocks, num_computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            state = self.requests[req_id]
            state.num_computed_tokens = num_computed
            if new_blocks:
                end = state.num_blocks + len(new_blocks)
                self.block_table_np[state.row, state.num_blocks : end] = new_blocks
                state.num_blocks = end

    def remove(self, req_id: str) -> None:
        """Free a finished or preempted request's row (unknown ids are ignored)."""
        state = self.requests.pop(req_id, None)
        if state is not None:
            self._free_rows.append(state.row)

    def append_tokens(
        self, states: list[CachedRequestState], rows: np.ndarray, positions: np.ndarray, token_ids: list[int]
    ) -> None:
        """Record one sampled token per request: `states[i]` (in row `rows[i]`, with
        `positions[i]` tokens so far) sampled `token_ids[i]`."""
        self.token_ids_np[rows, positions] = token_ids
        for state, token in zip(states, token_ids):
            state.output_token_ids.append(token)
