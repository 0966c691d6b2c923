"""When a request stops: the rule the scheduler applies to every sampled token, and
the precedence a stop string (found later, by the output processor's detokeniser)
takes against it."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..sampling_params import SamplingParams
from .request import Request

#: Why a request stopped, and the stop token or string that did it (vLLM's names).
StopDecision = tuple[str, int | str | None]


def stopped_by_token(params: SamplingParams, output_token_ids: Sequence[int]) -> bool:
    """Whether the last output token is a stop token that counts (min_tokens reached):
    the one reason a stop string completed by the same token does not override."""
    return len(output_token_ids) >= params.min_tokens and output_token_ids[-1] in params.all_stop_token_ids


def check_stop(request: Request, max_model_len: int | None, eos_token_ids: Collection[int]) -> StopDecision | None:
    """Whether `request` must stop after its last token, and why: a stop token (once
    min_tokens is reached; EOS reports no stop_reason), max_tokens (the answer's, past a
    thinking budget), or the context
    limit. Reads the request, changes nothing. (A stop string the detokenised text
    completes comes after a stop token and before the length limits.)"""
    params, token = request.params, request.output_token_ids[-1]
    if stopped_by_token(params, request.output_token_ids):
        return "stop", None if token in eos_token_ids else token
    max_output_tokens = request.max_output_tokens
    if max_output_tokens is not None and request.num_output_tokens >= max_output_tokens:
        return "length", None
    if max_model_len is not None and request.num_tokens >= max_model_len:
        return "length", None
    return None
