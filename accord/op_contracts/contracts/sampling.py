"""Contracts of the sampler (one token per row with its logprob and the top-N logprobs)
and of speculative decoding's rejection sampler (which drafted tokens to keep, and the
token after them)."""

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

def _draft_probs_cover_drafts(call: Mapping[str, Any]) -> tuple[str, str, str] | None:
    probs, drafts, logits = call["draft_probs"], call["draft_token_ids"], call["target_logits"]
    if probs is None or tuple(probs.shape) == (*drafts.shape, logits.shape[2]):
        return None
    return "draft_probs", f"[B, K, V] = {[*drafts.shape, logits.shape[2]]}", str(list(probs.shape))


REJECTION_SAMPLE = OpContract(
    name="rejection_sample",
    doc=(
        "Speculative decoding's check of K drafted tokens per row against the target "
        "model (Leviathan et al. 2023; Chen et al. 2023), lossless: each emitted token is "
        "distributed as the target's. Row b has num_draft_tokens[b] <= K drafts d_j; "
        "target_logits[b, j] are the target's logits after the first j of them (j = 0..K). "
        "p_j is the target's sampling distribution at j exactly as the sample contract "
        "defines it (temperature, then top-k, top-p, min-p, renormalised); q_j is "
        "draft_probs[b, j] (the draft's filtered distribution), or a point mass on d_j when "
        "draft_probs is absent (n-gram and other deterministic proposers). A greedy row "
        "(temperature < 1e-5) accepts d_j while d_j == argmax(target_logits[b, j]) (first "
        "maximum) and emits that argmax after the last accepted draft. A sampled row accepts "
        "d_j while uniforms[b, j] * q_j(d_j) < p_j(d_j) (a draft with q_j(d_j) = 0 is accepted "
        "iff p_j(d_j) > 0); at the first rejected j it emits a draw from max(0, p_j - q_j) "
        "renormalised (the recovered token; p_j where that is all zero), and with every "
        "draft accepted a draw from p_K at the row's last draft position n = "
        "num_draft_tokens[b] (the bonus token). The draw is the sample contract's "
        "exponential race over the row's race_uniforms: argmax over tokens r > 0 of "
        "r / -log(race_uniforms[b]). output_token_ids[b] holds the accepted drafts then the "
        "emitted token, -1 after it; num_accepted[b] counts the accepted drafts."
    ),
    tensors=(
        TensorSpec("target_logits", FLOAT_DTYPES, ("B", "K + 1", "V")),
        TensorSpec("draft_token_ids", (torch.int64,), ("B", "K"), index=True),
        TensorSpec("num_draft_tokens", (torch.int32,), ("B",), "drafts per row, at most K", index=True),
        TensorSpec("draft_probs", (torch.float32,), ("B", "K", "V"), "absent: each draft is a point mass",
                   optional=True),
        TensorSpec("temperature", (torch.float32,), ("B",)),
        TensorSpec("top_k", (torch.int32,), ("B",), "<= 0: off"),
        TensorSpec("top_p", (torch.float32,), ("B",), "1.0: off"),
        TensorSpec("min_p", (torch.float32,), ("B",), "0.0: off"),
        TensorSpec("uniforms", (torch.float32,), ("B", "K"), "acceptance draws in [0, 1)"),
        TensorSpec("race_uniforms", (torch.float32,), ("B", "V"), "the emitted token's race, in [0, 1)"),
    ),
    params=(),
    outputs=(
        OutputSpec("output_token_ids", ("B", "K + 1"), torch.int64, index=True),
        OutputSpec("num_accepted", ("B",), torch.int32, index=True),
    ),
    primary="target_logits",
    tolerance=ELEMENTWISE,
    rules=(Rule("draft_probs is [B, K, V]", _draft_probs_cover_drafts),),
)

CONTRACTS = (SAMPLE, REJECTION_SAMPLE)
