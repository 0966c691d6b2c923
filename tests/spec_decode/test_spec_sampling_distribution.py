"""Sampling with speculation draws from the distribution sampling without it draws from:
at temperature 0.8 with top-k 8 and top-p 0.9 (which the draft model's drafts follow
too), over many seeds, the tokens at the positions drafts
were checked for are indistinguishable (a two-sample chi-square test) from those of the
engine without speculation."""

from __future__ import annotations

import pytest

from collections import Counter

import torch

from accord.core.sampling_params import SamplingParams

#: Each test generates through a model (seconds on a 2-core host): the slow tier.
pytestmark = pytest.mark.slow

#: Per position and method tested; two positions, so a correct engine fails a method's test
#: with probability below 2e-3 over the choice of seeds (the seeds are fixed, so a run
#: repeats its verdict).
SIGNIFICANCE = 1e-3
DRAWS = 400
PROMPT = list(range(100, 130)) + list(range(100, 106))
ENGINE = {"max_model_len": 256, "num_gpu_blocks_override": 256}


def homogeneity_p_value(first: list[int], second: list[int]) -> float:
    """Pearson's two-sample chi-square test of two token samples coming from one
    distribution; tokens expected fewer than 5 times in either sample are pooled."""
    a, b = Counter(first), Counter(second)
    share = len(first) / (len(first) + len(second))
    bins, pooled = [], [0, 0]
    for token in a.keys() | b.keys():
        total = a[token] + b[token]
        if min(total * share, total * (1 - share)) >= 5:
            bins.append((a[token], b[token]))
        else:
            pooled[0] += a[token]
            pooled[1] += b[token]
    if sum(pooled):
        bins.append(tuple(pooled))
    observed = torch.tensor(bins, dtype=torch.float64)
    totals = observed.sum(1, keepdim=True)
    expected = torch.cat([totals * share, totals * (1 - share)], dim=1)
    statistic = ((observed - expected) ** 2 / expected).sum()
    freedom = torch.tensor(len(bins) - 1, dtype=torch.float64)
    return float(torch.special.gammaincc(freedom / 2, statistic / 2))


def draws(llm) -> list[list[int]]:
    prompts = [{"prompt_token_ids": PROMPT}] * DRAWS
    params = [SamplingParams(max_tokens=3, temperature=0.8, top_k=8, top_p=0.9, seed=seed) for seed in range(DRAWS)]
    return [output.outputs[0].token_ids for output in llm.generate(prompts, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def draws_without_speculation(counting_llama_dir, make_llm) -> list[list[int]]:
    return draws(make_llm(counting_llama_dir, **ENGINE))


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_sampled_tokens_are_distributed_as_without_speculation(counting_llama_dir, make_llm,
                                                               draws_without_speculation, method, request) -> None:
    config = {"method": method, "num_speculative_tokens": 2}
    if method == "draft_model":
        # The draft draws its drafts from its own distribution under the request's
        # filters, handed to the check with them.
        config["model"] = str(request.getfixturevalue("counting_draft_dir"))
    spec = make_llm(counting_llama_dir, speculative_config=config, **ENGINE)
    with_spec = draws(spec)
    assert spec.llm_engine.stats.spec_decode_num_accepted_tokens > DRAWS // 4  # the check really ran
    for position in (1, 2):
        p_value = homogeneity_p_value([t[position] for t in with_spec], [t[position] for t in draws_without_speculation])
        assert p_value >= SIGNIFICANCE, f"{method}, position {position}: p = {p_value:.2g}"
