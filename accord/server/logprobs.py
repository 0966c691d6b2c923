"""Engine logprobs (per token: a dict of token id to Logprob) in the two OpenAI
shapes: the legacy completions lists and chat's per-token objects.

A token's `bytes` are its real bytes (a token may hold part of a UTF-8 character), and
a completion's `text_offset` counts the characters of the choice's text before the
token, so both stay right for partial characters and for `token_id:N` names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..core.outputs import Logprob
from .protocol import CompletionLogprobs, TokenLogprob, TopLogprob


@dataclass(frozen=True)
class LogprobFormat:
    """How tokens appear in logprobs: their text (the engine's decoding, else
    `decode`), or vLLM's `token_id:N` (`return_tokens_as_token_ids`); their bytes; and
    which ids are special tokens (absent from the visible text)."""

    decode: Callable[[int], str]
    token_bytes: Callable[[int], bytes]
    is_special: Callable[[int], bool]
    as_token_ids: bool = False

    def name(self, token_id: int, entry: Logprob) -> str:
        """The token as logprobs name it."""
        if self.as_token_ids:
            return f"token_id:{token_id}"
        return entry.decoded_token if entry.decoded_token is not None else self.decode(token_id)

    def text_bytes(self, token_ids: Sequence[int]) -> bytes:
        """The bytes `token_ids` add to the visible text (special tokens add none)."""
        return b"".join(self.token_bytes(t) for t in token_ids if not self.is_special(t))

    def offsets(self, token_ids: Sequence[int], previous_token_ids: Sequence[int], base: int) -> list[int]:
        """Character offset of each of `token_ids` in a text that holds `base`
        characters, then the text of `previous_token_ids`: the whole characters
        decoded before the token (a token that ends inside a character does not count
        it; the token that completes it does)."""
        data = bytearray(self.text_bytes(previous_token_ids))
        offsets = []
        for token_id in token_ids:
            offsets.append(base + len(data.decode("utf-8", errors="ignore")))
            if not self.is_special(token_id):
                data += self.token_bytes(token_id)
        return offsets


def _candidates(candidates: dict[int, Logprob], chosen: int, limit: int | None) -> list[tuple[int, Logprob]]:
    """A position's candidates in vLLM's order: the chosen token first, then the rest by
    rank (by logprob where the engine gave none); the first `limit` (None: all)."""
    others = sorted(
        ((token_id, entry) for token_id, entry in candidates.items() if token_id != chosen),
        key=lambda item: (item[1].rank if item[1].rank is not None else 0, -item[1].logprob),
    )
    ordered = [(chosen, candidates[chosen]), *others]
    return ordered if limit is None else ordered[:limit]


def completion_logprobs(
    result: CompletionLogprobs,
    token_ids: Sequence[int],
    entries: Sequence[dict[int, Logprob] | None],
    top_count: int,
    fmt: LogprobFormat,
    base_offset: int,
    previous_token_ids: Sequence[int],
) -> CompletionLogprobs:
    """Append legacy completions logprobs for `token_ids` to `result`; an entry of
    None (the first prompt token, which nothing predicts) gives null logprobs. Each
    top_logprobs dict holds the chosen token first and up to `top_count` others (vLLM
    returns logprobs + 1 entries; -1: every candidate)."""
    offsets = fmt.offsets(token_ids, previous_token_ids, base_offset)
    for token_id, candidates, offset in zip(token_ids, entries, offsets):
        result.text_offset.append(offset)
        if candidates is None:
            result.tokens.append(fmt.name(token_id, Logprob(0.0)))
            result.token_logprobs.append(None)
            result.top_logprobs.append(None)
            continue
        result.tokens.append(fmt.name(token_id, candidates[token_id]))
        result.token_logprobs.append(candidates[token_id].logprob)
        limit = None if top_count == -1 else top_count + 1
        top = {fmt.name(t, entry): entry.logprob for t, entry in _candidates(candidates, token_id, limit)}
        result.top_logprobs.append(top)
    return result


def chat_logprobs(
    token_ids: Sequence[int], logprobs: Sequence[dict[int, Logprob]], top_count: int, fmt: LogprobFormat
) -> list[TokenLogprob]:
    """Chat logprobs entries for `token_ids`: top_logprobs are the first `top_count`
    candidates in vLLM's order, the chosen token first (-1: every candidate)."""
    entries = []
    limit = None if top_count == -1 else top_count
    for token_id, candidates in zip(token_ids, logprobs):
        top = [
            TopLogprob(token=fmt.name(t, entry), logprob=entry.logprob, bytes=list(fmt.token_bytes(t)))
            for t, entry in _candidates(candidates, token_id, limit)
        ]
        entries.append(
            TokenLogprob(
                token=fmt.name(token_id, candidates[token_id]), logprob=candidates[token_id].logprob,
                bytes=list(fmt.token_bytes(token_id)), top_logprobs=top,
            )
        )
    return entries
