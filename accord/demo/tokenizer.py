"""The embedded demo model's tokenizer: a byte-level BPE whose merges are learned by a
small, fully deterministic trainer over a fixed in-code corpus.

We train in plain Python rather than with `tokenizers`' trainer because the latter
breaks ties between equally frequent pairs in an order that is not promised to be
stable; here ties go to the lexicographically smallest pair, so every machine builds
byte-identical files.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import lru_cache

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|eot_id|>"
#: Special tokens, appended after the BPE vocabulary (Llama-3 style names).
SPECIAL_TOKENS = (BOS_TOKEN, "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", EOS_TOKEN)

#: Llama-3-style chat template; the BOS comes from the template, so chat prompts are
#: encoded without the post-processor's special tokens.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)

NUM_MERGES = 1000

CORPUS = """\
accord is a serving engine for large language models. It gives the same OpenAI compatible
API on NVIDIA, AMD, Huawei Ascend and plain CPUs. Every kernel call crosses a typed op
contract, and a conformance suite proves that each backend honours the contracts and
matches the reference numerics before an image or a config is rolled out.
The scheduler builds each step under a token budget: running decodes first, then prefill
chunks, preempting by recompute when blocks run out. The block manager hands out fixed
size blocks of the key and value cache through block tables, and hashes full blocks so a
shared prefix is reused instead of computed again. The model runner flattens a step into
one batch of token ids, positions, slot mappings and sequence lengths.
This demo model has random weights. It writes text that means nothing, but it runs fast
on a small machine, so the first command in the README works without a download.
Hello! How are you today? I am fine, thank you. What is the capital of France? Paris is
the capital of France. The quick brown fox jumps over the lazy dog. Once upon a time
there was a little robot who wanted to learn how to write stories about the sea, the
mountains, the sky and the stars. Please write a short poem about the moon. Tell me a
joke. Explain how a computer works in simple words. Translate this sentence into German.
user assistant system message content role question answer request response model
one two three four five six seven eight nine ten hundred thousand 0 1 2 3 4 5 6 7 8 9
def main(): return print("hello, world") # import json, yaml; x = [1, 2, 3] {"key": 42}
"""

# GPT-2's pre-tokenisation pattern restricted to ASCII (the corpus is ASCII); the
# runtime tokenizer uses the real Unicode pattern, which splits this text identically.
_PRETOKEN_PATTERN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")


@lru_cache(maxsize=1)
def byte_alphabet() -> tuple[str, ...]:
    """GPT-2's byte-to-printable-character map, indexed by byte value (the alphabet the
    ByteLevel pre-tokenizer maps bytes into)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for byte in range(256):
        if byte not in chars:
            chars[byte] = chr(256 + extra)
            extra += 1
    return tuple(chars[b] for b in range(256))


def train_merges(corpus: str, num_merges: int) -> list[tuple[str, str]]:
    """Byte-level BPE merges learned from `corpus`, most frequent pair first, ties to
    the lexicographically smallest pair."""
    alphabet = byte_alphabet()
    words: Counter[tuple[str, ...]] = Counter(
        tuple(alphabet[b] for b in piece.encode("utf-8")) for piece in _PRETOKEN_PATTERN.findall(corpus)
    )
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pair_counts: Counter[tuple[str, str]] = Counter()
        for word, count in words.items():
            for pair in zip(word, word[1:]):
                pair_counts[pair] += count
        if not pair_counts:
            break
        best = min(pair_counts, key=lambda pair: (-pair_counts[pair], pair))
        merges.append(best)
        words = Counter({_merge_pair(word, best): count for word, count in words.items()})
    return merges


def _merge_pair(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    merged: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            merged.append(word[i] + word[i + 1])
            i += 2
        else:
            merged.append(word[i])
            i += 1
    return tuple(merged)


def build_demo_tokenizer() -> Tokenizer:
    """The demo tokenizer: 256 byte tokens, then the merges, then the special tokens; a
    BOS is prepended to every encoding that asks for special tokens."""
    merges = train_merges(CORPUS, NUM_MERGES)
    vocab = {char: index for index, char in enumerate(byte_alphabet())}
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS])
    bos_id = tokenizer.token_to_id(BOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A", pair=f"{BOS_TOKEN} $A {BOS_TOKEN} $B", special_tokens=[(BOS_TOKEN, bos_id)]
    )
    return tokenizer
