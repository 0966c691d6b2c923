"""Contract of the sampler: one token per row with its logprob and the top-N logprobs."""

from __future__ import annotations

import torch

from typing import Any, Mapping

from ..spec import FLOAT_DTYPES, OpContract, OutputSpec, ParamSpec, Rule, TensorSpec, UnorderedRows
from .common import ELEMENTWISE


def _logprobs_fit_vocab(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    vocab, wanted = call["logits"].shape[1], call["num_logprobs"]
    if 0 <= wanted <= vocab:
        return None
    return "num_logprobs", f"0..{vocab} (the vocabulary)", str(wanted)


SAMPLE = OpContract(
    name="sample",
    doc=(
        "Per row b: a row with temperature < 1e-5 is greedy, token = argmax(logits) "
        "(first index on ties). Otherwise l = logits / temperature in fp32, p = softmax(l), "
        "then filters, each leaving p renormalised: top_k > 0 keeps tokens whose p is at "
        "least the k-th largest; top_p < 1 keeps, in descending p order, each token whose "
        "preceding cumulative p is below top_p; min_p > 0 keeps tokens with p >= min_p * "
        "max(p). The draw is defined exactly so every backend agrees: u = torch.rand(V, "
        "generator=torch.Generator('cpu').manual_seed(seeds[b])), token = argmax(p / "
        "-log(u)) (an exponential race, which samples from p). logprobs are those of the "
        "raw logits (log_softmax before any filter): the chosen token's, and the top "
        "num_logprobs of the row. top_p must be in (0, 1] and min_p in [0, 1] (the "
        "engine's SamplingParams enforce it; kernels need not check values)."
    ),
    tensors=(
        TensorSpec("logits", FLOAT_DTYPES, ("B", "V")),
        TensorSpec("temperature", (torch.float32,), ("B",)),
        TensorSpec("top_k", (torch.int32,), ("B",), "<= 0: off"),
        TensorSpec("top_p", (torch.float32,), ("B",), "1.0: off"),
        TensorSpec("min_p", (torch.float32,), ("B",), "0.0: off"),
        TensorSpec("seeds", (torch.int64,), ("B",), "the draw's seed per row"),
    ),
    params=(ParamSpec("num_logprobs", int, 0, doc="N top logprobs to return per row"),),
    outputs=(
        OutputSpec("token_ids", ("B",), torch.int64, index=True),
        OutputSpec("logprobs", ("B",), torch.float32),
        OutputSpec("top_logprobs", ("B", "num_logprobs"), torch.float32),
        OutputSpec("top_token_ids", ("B", "num_logprobs"), torch.int64, index=True),
    ),
    primary="logits",
    tolerance=ELEMENTWISE,
    unordered_rows=UnorderedRows("top_token_ids", ("top_logprobs",)),
    rules=(Rule("num_logprobs is at most the vocabulary", _logprobs_fit_vocab),),
)

CONTRACTS = (SAMPLE,)
