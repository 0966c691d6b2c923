"""The sampler's host-side paths: a step whose rows are all greedy without logprobs
takes the argmax alone, and must pick what the sample contract picks on the reference
backend (penalties, min_tokens and logit_bias applied first, first maximum on ties);
the per-row settings tensors it keeps between steps follow a change of settings; a
sequence's cumulative logprob is reported only when logprobs were asked for (vLLM's
convention), and then sums the chosen tokens' logprobs."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import pytest
import torch

from accord import SamplingParams
from accord.backends import get_backend
from accord.core.worker.sampler import Sampler
from accord.op_contracts import OpDispatcher

VOCAB = 50


@dataclass
class Row:
    req_id: str
    params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=lambda: [3, 4])
    output_token_ids: list[int] = field(default_factory=list)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


def _contract_tokens(logits: torch.Tensor, rows: list[Row]) -> list[int]:
    """The reference backend's sample contract on the same processed logits: every
    row greedy, with one row asking for logprobs so the contract path is taken."""
    sampler = Sampler(OpDispatcher(get_backend("reference")), seed=0)
    with_logprobs = [Row(r.req_id, replace(r.params, logprobs=0), r.prompt_token_ids, r.output_token_ids) for r in rows]
    return sampler(logits, with_logprobs).token_ids


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_the_greedy_fast_path_picks_what_the_sample_contract_picks(backend: str) -> None:
    torch.manual_seed(0)
    logits = torch.randn(5, VOCAB)
    logits[1, [7, 9]] = 20.0  # a tie: the first maximum wins
    rows = [
        Row("plain", SamplingParams(temperature=0.0)),
        Row("tie", SamplingParams(temperature=0.0)),
        Row("penalised", SamplingParams(temperature=0.0, repetition_penalty=1.5, presence_penalty=1.0),
            output_token_ids=[int(logits[2].argmax())]),
        Row("biased", SamplingParams(temperature=0.0, logit_bias={11: 100.0})),
        Row("min_tokens", SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[int(logits[4].argmax())])),
    ]
    for row in rows:
        row.params.all_stop_token_ids = set(row.params.stop_token_ids)
    sampled = Sampler(OpDispatcher(get_backend(backend)), seed=0)(logits, rows)
    tokens = sampled.token_ids
    assert tokens == _contract_tokens(logits, rows)
    assert tokens[1] == 7 and tokens[3] == 11 and tokens[4] != int(logits[4].argmax())
    assert sampled.logprobs == [None] * 5 and sampled.top_logprobs == [None] * 5


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_the_settings_kept_between_steps_follow_a_change(backend: str) -> None:
    sampler = Sampler(OpDispatcher(get_backend(backend)), seed=0)
    logits = torch.zeros(4, VOCAB)  # a flat distribution: a draw rarely hits the argmax
    logits[:, 13] = 1e-3
    drawn = [Row(f"r{i}", SamplingParams(temperature=1.0, seed=i)) for i in range(4)]
    first = sampler(logits, drawn).token_ids
    assert first != [13] * 4
    # Same batch size, new settings objects: top_k=1 leaves only the argmax.
    narrowed = [Row(f"r{i}", SamplingParams(temperature=1.0, seed=i, top_k=1)) for i in range(4)]
    assert sampler(logits, narrowed).token_ids == [13] * 4
    # The settings of the first rows again: the same seeded draws as the first time.
    assert sampler(logits, drawn).token_ids == first


def test_cumulative_logprob_only_when_logprobs_are_asked(llama_dir, make_llm) -> None:
    llm = make_llm(llama_dir, backend="cpu", max_model_len=128)
    prompt = {"prompt_token_ids": [5, 6, 7, 8]}
    plain, with_logprobs = llm.generate(
        [prompt, prompt],
        [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True),
         SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)],
        use_tqdm=False,
    )
    assert plain.outputs[0].cumulative_logprob is None
    completion = with_logprobs.outputs[0]
    assert completion.token_ids == plain.outputs[0].token_ids
    chosen = [entry[token].logprob for entry, token in zip(completion.logprobs, completion.token_ids)]
    assert math.isclose(completion.cumulative_logprob, sum(chosen), rel_tol=1e-6)
    assert all(value < 0.0 for value in chosen)
