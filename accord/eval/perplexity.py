"""Perplexity as llama.cpp's `llama-perplexity` measures it (tools/perplexity, its
default mode), so the two engines' figures compare on the same model file and text.

The whole text is tokenised once (with the tokenizer's BOS when it adds one) and cut
into consecutive chunks of `n_ctx` tokens; a partial chunk at the end is dropped. Each
chunk is scored on its own, from an empty cache, its first token replaced by BOS when
the tokenizer adds one. Only the second half of a chunk is scored, so every scored
token has at least n_ctx/2 tokens of context: the logits at positions n_ctx/2 ..
n_ctx - 2 predict the tokens after them (n_ctx - n_ctx/2 - 1 per chunk). PPL is
exp(mean NLL) over every scored token, and its uncertainty is llama.cpp's:
PPL * sqrt(var(NLL) / (count - 1)).

The log-probabilities are the engine's: prompt logprobs of one request per chunk,
batched through the scheduler like any other prompts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..core.sampling_params import SamplingParams

if TYPE_CHECKING:  # annotations only: the CLI's parser imports this module
    from ..core.engine.llm import LLM
    from ..core.model_loader.tokenizer import Tokenizer

#: llama-perplexity's default context (its -c).
DEFAULT_CTX_SIZE = 512


class PerplexityInputError(ValueError):
    """The text or the chunking asked for cannot give a perplexity (too short, say)."""


@dataclass(frozen=True)
class Perplexity:
    """One perplexity measurement: PPL, its standard error, the mean NLL (nats per
    token) and what was scored."""

    ppl: float
    stderr: float
    mean_nll: float
    ctx_size: int
    chunks: int
    scored_tokens: int
    text_tokens: int


def check_window_settings(ctx_size: int, max_chunks: int | None) -> None:
    """PerplexityInputError unless `ctx_size` is even and at least 4 (half of it is
    context, half is scored) and `max_chunks` is None or at least 1."""
    if ctx_size < 4 or ctx_size % 2:
        raise PerplexityInputError(f"the context size must be an even number of at least 4 tokens, got {ctx_size}")
    if max_chunks is not None and max_chunks < 1:
        raise PerplexityInputError(f"the number of chunks must be at least 1, got {max_chunks}")


def chunk_windows(tokens: Sequence[int], ctx_size: int, max_chunks: int | None, bos_id: int | None) -> list[list[int]]:
    """The token windows llama-perplexity scores: consecutive `ctx_size`-token chunks
    (at most `max_chunks`), each starting with `bos_id` in place of its first token when
    given. PerplexityInputError when the text holds no whole chunk."""
    check_window_settings(ctx_size, max_chunks)
    available = len(tokens) // ctx_size
    if available == 0:
        raise PerplexityInputError(
            f"the text tokenises to {len(tokens)} tokens, fewer than one chunk of {ctx_size}; give a longer text or a "
            "smaller context size"
        )
    windows = []
    for chunk in range(available if max_chunks is None else min(max_chunks, available)):
        window = list(tokens[chunk * ctx_size : (chunk + 1) * ctx_size])
        if bos_id is not None:
            window[0] = bos_id
        windows.append(window)
    return windows


def scored_positions(ctx_size: int) -> range:
    """The positions in a window whose tokens are scored: the second half but its first
    (predicted from position ctx_size/2 onwards)."""
    return range(ctx_size // 2 + 1, ctx_size)


def summarise(nlls: Sequence[float], ctx_size: int, chunks: int, text_tokens: int) -> Perplexity:
    """PPL and llama.cpp's standard error from the scored tokens' NLLs (in fp64)."""
    count = len(nlls)
    mean = math.fsum(nlls) / count
    variance = math.fsum(v * v for v in nlls) / count - mean * mean
    ppl = math.exp(mean)
    stderr = ppl * math.sqrt(variance / (count - 1)) if variance > 0 and count > 1 else float("nan")
    return Perplexity(ppl, stderr, mean, ctx_size, chunks, count, text_tokens)


def adds_bos(tokenizer: Tokenizer) -> int | None:
    """The BOS id when the tokenizer puts one before the text (as llama.cpp's add_bos),
    else None."""
    bos = tokenizer.bos_token_id
    if bos is None:
        return None
    plain, special = tokenizer.encode("a", add_special_tokens=False), tokenizer.encode("a", add_special_tokens=True)
    return bos if special[: len(special) - len(plain)] == [bos] else None


def measure_perplexity(llm: LLM, text: str, ctx_size: int = DEFAULT_CTX_SIZE, max_chunks: int | None = None) -> Perplexity:
    """The perplexity of the model `llm` serves over `text`, chunked as llama-perplexity
    does. PerplexityInputError for a text shorter than a chunk (an empty one too)."""
    tokenizer = llm.get_tokenizer()
    tokens = tokenizer.encode(text, add_special_tokens=True)
    windows = chunk_windows(tokens, ctx_size, max_chunks, adds_bos(tokenizer))
    # One token is generated per request (the engine always samples one); detokenising
    # the prompt logprobs is not needed.
    params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0, detokenize=False)
    outputs = llm.generate([{"prompt_token_ids": window} for window in windows], params, use_tqdm=False)
    positions = scored_positions(ctx_size)
    nlls = []
    for window, output in zip(windows, outputs):
        entries = output.prompt_logprobs
        if entries is None or len(entries) != ctx_size:
            raise RuntimeError(f"the engine returned {0 if entries is None else len(entries)} prompt logprobs for a "
                               f"{ctx_size}-token chunk")
        nlls.extend(-entries[p][window[p]].logprob for p in positions)  # type: ignore[index]
    return summarise(nlls, ctx_size, len(windows), len(tokens))
