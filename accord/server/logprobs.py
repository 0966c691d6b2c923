"""Engine logprobs (per token: a dict of token id to Logprob) in the two OpenAI
shapes: the legacy completions lists and chat's per-token objects."""

from __future__ import annotations

from collections.abc import Callable

from ..core.outputs import Logprob, SampleLogprobs
from .protocol import CompletionLogprobs, TokenLogprob, TopLogprob

#: Names a token in logprobs, from its id and its engine entry.
TokenText = Callable[[int, Logprob], str]


def token_text_function(decode: Callable[[int], str], as_token_ids: bool) -> TokenText:
    """How tokens are named in logprobs: their text (the engine's decoding, else
    `decode`), or vLLM's `token_id:N` (`return_tokens_as_token_ids`), which stays exact
    for tokens that are not whole characters."""
    if as_token_ids:
        return lambda token_id, entry: f"token_id:{token_id}"
    return lambda token_id, entry: entry.decoded_token if entry.decoded_token is not None else decode(token_id)


def _top(candidates: dict[int, Logprob], count: int) -> list[tuple[int, Logprob]]:
    # The sampled token is in the dict even when it ranks below the top N, so keep
    # ranks 1..N only (ordering by logprob where the engine gave no rank).
    ranked = sorted(candidates.items(), key=lambda item: (item[1].rank or 0, -item[1].logprob))
    return [(token_id, entry) for token_id, entry in ranked if entry.rank is None or entry.rank <= count][:count]


def completion_logprobs(
    token_ids: list[int], logprobs: SampleLogprobs, top_count: int, token_text: TokenText, text_offset: int
) -> CompletionLogprobs:
    """Legacy completions logprobs for `token_ids`, offsets counted from `text_offset`."""
    result = CompletionLogprobs()
    for token_id, candidates in zip(token_ids, logprobs):
        text = token_text(token_id, candidates[token_id])
        result.tokens.append(text)
        result.token_logprobs.append(candidates[token_id].logprob)
        top = {token_text(t, entry): entry.logprob for t, entry in _top(candidates, top_count)}
        result.top_logprobs.append(top or None)
        result.text_offset.append(text_offset)
        text_offset += len(text)
    return result


def chat_logprobs(
    token_ids: list[int], logprobs: SampleLogprobs, top_count: int, token_text: TokenText
) -> list[TokenLogprob]:
    """Chat logprobs entries for `token_ids`."""
    entries = []
    for token_id, candidates in zip(token_ids, logprobs):
        text = token_text(token_id, candidates[token_id])
        top = []
        for t, entry in _top(candidates, top_count):
            top_text = token_text(t, entry)
            top.append(TopLogprob(token=top_text, logprob=entry.logprob, bytes=list(top_text.encode())))
        entries.append(
            TokenLogprob(token=text, logprob=candidates[token_id].logprob, bytes=list(text.encode()), top_logprobs=top)
        )
    return entries
