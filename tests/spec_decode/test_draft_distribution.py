"""A draft model draws sampled requests' drafts from its distribution under the
request's own temperature, top-k, top-p and min-p: the same distribution the reference
backend's sample contract draws from (the golden), on random logits with ties."""

from __future__ import annotations

import pytest
import torch

from accord.backends.reference.kernels.sampling import filtered_distribution
from accord.core.sampling_params import SamplingParams
from accord.core.worker.drafting.base import draft_distribution

SETTINGS = [
    {"temperature": 0.8},
    {"temperature": 0.8, "top_p": 0.9},
    {"temperature": 1.3, "top_k": 5},
    {"temperature": 0.7, "top_k": 12, "top_p": 0.6, "min_p": 0.05},
    {"temperature": 1.0, "min_p": 0.2},
]


@pytest.mark.parametrize("settings", SETTINGS, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()))
def test_the_draft_distribution_is_the_sample_contracts(settings: dict) -> None:
    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 64, generator=generator) * 3
    logits[:, 10] = logits[:, 11]  # a tie at every rank the filters may cut at
    params = SamplingParams(**settings)
    expected = filtered_distribution(
        logits, torch.full((8,), params.temperature), torch.full((8,), params.top_k, dtype=torch.int32),
        torch.full((8,), params.top_p), torch.full((8,), params.min_p),
    )
    ours = torch.stack([draft_distribution(row, params) for row in logits])
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-7)
    if params.top_k > 0:
        assert int((ours[0] > 0).sum()) <= params.top_k + 1  # the filters really cut
