"""The structured-output mask in the sampling path: the bitmask (llguidance's layout:
bit b of int32 word w allows token 32w + b) removes exactly the forbidden tokens, and
the sampler on each built-in CPU-capable backend never picks one."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
import torch

from accord import SamplingParams
from accord.backends import get_backend
from accord.core.worker.sampler import Sampler
from accord.core.structured_output import GrammarBitmask, StructuredOutputsParams, apply_token_bitmask
from accord.op_contracts import OpDispatcher

VOCAB = 70  # not a multiple of 32: the last word is partial


def pack(allowed: set[int]) -> torch.Tensor:
    """A bitmask row built bit by bit, independently of the code under test."""
    words = [0] * ((VOCAB + 31) // 32)
    for token in allowed:
        words[token // 32] |= 1 << (token % 32)
    # int32 words: the top bit is the sign.
    return torch.tensor([w - (1 << 32) if w >= 1 << 31 else w for w in words], dtype=torch.int32)


def test_the_mask_keeps_exactly_the_allowed_tokens() -> None:
    allowed = [{0, 31, 32, 63, 69}, set(range(0, VOCAB, 3))]
    mask = GrammarBitmask(["a", "b"], torch.stack([pack(a) for a in allowed]))
    logits = torch.randn(3, VOCAB)
    masked = apply_token_bitmask(logits, {"b": 0, "a": 2}, mask)  # rows out of mask order; row 1 free
    for row, tokens in ((2, allowed[0]), (0, allowed[1])):
        kept = set(torch.isfinite(masked[row]).nonzero().flatten().tolist())
        assert kept == tokens
        assert torch.equal(masked[row][list(tokens)], logits[row][list(tokens)])
    assert torch.equal(masked[1], logits[1])


@dataclass
class Row:
    req_id: str
    params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=lambda: [1])
    output_token_ids: list[int] = field(default_factory=list)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)


@pytest.mark.parametrize("backend", ["reference", "cpu"])
def test_the_sampler_never_draws_a_masked_token(backend: str) -> None:
    sampler = Sampler(OpDispatcher(get_backend(backend)), seed=0)
    rows = [Row(f"r{s}", SamplingParams(temperature=1.0, seed=s)) for s in range(8)]
    allowed = {5, 40, 66}
    mask = GrammarBitmask([row.req_id for row in rows], torch.stack([pack(allowed)] * len(rows)))
    logits = torch.randn(len(rows), VOCAB)
    logits[:, 7] = 50.0  # the model's favourite is forbidden
    tokens = sampler(logits, rows, mask).token_ids
    assert set(tokens) <= allowed


def test_exactly_one_constraint_is_required() -> None:
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=("b",))
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
