"""Finding 1 of issue 13: every sampling parameter is checked when the request is
made (ranges, integer widths, ids inside the vocabulary; -1 and booleans are never
ids), so nothing a kernel would choke on reaches a step."""

from __future__ import annotations

import math

import pytest

from accord import SamplingParams


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"top_k": 2**31}, "top_k"),  # overflowed the sampler's int32 tensor
        ({"top_k": 2**40}, "top_k"),
        ({"top_k": True}, "top_k"),
        ({"n": True}, "n"),
        ({"max_tokens": 2**63}, "max_tokens"),
        ({"max_tokens": 1.5}, "max_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"seed": 2**64}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"stop_token_ids": [-1]}, "stop_token_ids"),
        ({"stop_token_ids": [True]}, "stop_token_ids"),
        ({"stop_token_ids": [2**63]}, "stop_token_ids"),
        ({"temperature": math.nan}, "temperature"),
        ({"temperature": math.inf}, "temperature"),
        ({"top_p": math.nan}, "top_p"),
        ({"logit_bias": {5: 101.0}}, "logit_bias"),
        ({"logit_bias": {-1: 1.0}}, "logit_bias"),
        ({"logit_bias": {False: 1.0}}, "logit_bias"),
        ({"logit_bias": {5: math.nan}}, "logit_bias"),
        ({"stop": [5]}, "stop"),
    ],
)
def test_out_of_range_or_mistyped_settings_are_refused(settings: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**settings)


@pytest.mark.parametrize(
    ("settings", "field"),
    [
        ({"stop_token_ids": [100]}, "stop_token_ids"),
        ({"logit_bias": {100: 1.0}}, "logit_bias"),
        ({"logprobs": 101}, "logprobs"),
    ],
)
def test_ids_outside_the_vocabulary_are_refused(settings: dict, field: str) -> None:
    params = SamplingParams(**settings)
    with pytest.raises(ValueError, match=field):
        params.verify_vocab(100)


def test_edge_values_are_accepted() -> None:
    params = SamplingParams(top_k=2**31 - 1, seed=-(2**63), stop_token_ids=[0, 99], logit_bias={99: -100.0})
    params.verify_vocab(100)
    assert SamplingParams(top_k=-1).top_k == -1  # -1 disables top-k, as in vLLM
