"""When a sequence stops: the one rule the scheduler applies to every sampled token
(and to a stop string the output processor's detokeniser found)."""

from __future__ import annotations

from collections.abc import Collection

from .request import Sequence

#: Why a sequence stopped, and the stop token or string that did it (vLLM's names).
StopDecision = tuple[str, int | str | None]


def check_stop(
    seq: Sequence, max_model_len: int | None, eos_token_ids: Collection[int], stop_string: str | None = None
) -> StopDecision | None:
    """Whether `seq` must stop after its last token, and why: a stop token (once
    min_tokens is reached; EOS reports no stop_reason), a stop string the detokenised
    text completed, max_tokens, or the context limit. Reads the sequence, changes nothing."""
    params, token = seq.params, seq.output_token_ids[-1]
    if seq.num_output_tokens >= params.min_tokens and token in params.all_stop_token_ids:
        return "stop", None if token in eos_token_ids else token
    if stop_string is not None:
        return "stop", stop_string
    if params.max_tokens is not None and seq.num_output_tokens >= params.max_tokens:
        return "length", None
    if max_model_len is not None and seq.num_tokens >= max_model_len:
        return "length", None
    return None
