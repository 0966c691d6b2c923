"""The prompts `accord bench serve` sends, by vLLM's dataset names: `random` (random
token ids of seeded lengths), `prefix_repetition` (a few shared prefixes, each with
random suffixes), `sharegpt` (the first two turns of ShareGPT conversations) and
`custom` (a JSON-lines file with a "prompt" per line). Every draw is seeded."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

#: The dataset names `--dataset-name` takes (vLLM's).
DATASET_NAMES = ("random", "sharegpt", "prefix_repetition", "custom")


class TextTokenizer(Protocol):
    """What the datasets need of a tokenizer (accord's `Tokenizer` is one)."""

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


@dataclass(frozen=True)
class SampleRequest:
    """One request to send: the prompt (token ids, or text), its length in tokens and
    the number of output tokens to ask for."""

    prompt: str | list[int]
    prompt_len: int
    expected_output_len: int


@dataclass(frozen=True)
class DatasetSpec:
    """`--dataset-name` and the options of each dataset (vLLM's flags)."""

    name: str = "random"
    path: str | None = None
    random_input_len: int = 1024
    random_output_len: int = 128
    random_range_ratio: float = 0.0
    random_prefix_len: int = 0
    prefix_repetition_prefix_len: int = 256
    prefix_repetition_suffix_len: int = 256
    prefix_repetition_num_prefixes: int = 10
    prefix_repetition_output_len: int = 128
    sharegpt_output_len: int | None = None
    custom_output_len: int = 256

    def __post_init__(self) -> None:
        if self.name not in DATASET_NAMES:
            raise ValueError(f"unknown dataset {self.name!r}: choose one of {', '.join(DATASET_NAMES)}")
        if self.name in ("sharegpt", "custom") and self.path is None:
            raise ValueError(f"--dataset-name {self.name} reads a file: give it with --dataset-path")
        if self.name in ("random", "prefix_repetition") and self.path is not None:
            raise ValueError(f"--dataset-name {self.name} draws its prompts; --dataset-path is for sharegpt or custom")
        if not 0.0 <= self.random_range_ratio < 1.0:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {self.random_range_ratio}")

    @property
    def needs_tokenizer(self) -> bool:
        """Whether drawing the prompts needs the model's tokenizer (every dataset but
        `custom` counts or draws tokens)."""
        return self.name != "custom"


def length_range(mean: int, ratio: float) -> tuple[int, int]:
    """The inclusive range lengths are drawn from: `mean` * (1 -/+ `ratio`), at least 1."""
    return max(1, math.floor(mean * (1 - ratio))), max(1, math.ceil(mean * (1 + ratio)))


def _random_ids(rng: random.Random, count: int, vocab_size: int) -> list[int]:
    # Ids below 3 are skipped: they are the special tokens (pad, BOS, EOS) of most vocabularies.
    return [rng.randrange(3, vocab_size) for _ in range(count)]


def random_requests(spec: DatasetSpec, num: int, tokenizer: TextTokenizer, rng: random.Random) -> list[SampleRequest]:
    """`num` prompts of random token ids, lengths uniform in `length_range` (after a
    shared random prefix of `random_prefix_len` ids), outputs likewise. The ids are sent
    as ids, so the server reads exactly `prompt_len` tokens."""
    low_in, high_in = length_range(spec.random_input_len, spec.random_range_ratio)
    low_out, high_out = length_range(spec.random_output_len, spec.random_range_ratio)
    prefix = _random_ids(rng, spec.random_prefix_len, tokenizer.vocab_size)
    requests = []
    for _ in range(num):
        ids = prefix + _random_ids(rng, rng.randint(low_in, high_in), tokenizer.vocab_size)
        requests.append(SampleRequest(ids, len(ids), rng.randint(low_out, high_out)))
    return requests


def prefix_repetition_requests(
    spec: DatasetSpec, num: int, tokenizer: TextTokenizer, rng: random.Random
) -> list[SampleRequest]:
    """`num` prompts over `prefix_repetition_num_prefixes` random prefixes, each prompt a
    prefix and a fresh random suffix, shuffled (what a prefix cache can reuse)."""
    vocab = tokenizer.vocab_size
    prefixes = [_random_ids(rng, spec.prefix_repetition_prefix_len, vocab) for _ in range(spec.prefix_repetition_num_prefixes)]
    requests = []
    for index in range(num):
        ids = prefixes[index % len(prefixes)] + _random_ids(rng, spec.prefix_repetition_suffix_len, vocab)
        requests.append(SampleRequest(ids, len(ids), spec.prefix_repetition_output_len))
    rng.shuffle(requests)
    return requests


def sharegpt_requests(spec: DatasetSpec, num: int, tokenizer: TextTokenizer, rng: random.Random) -> list[SampleRequest]:
    """`num` conversations of a ShareGPT JSON file, shuffled: the first turn is the
    prompt, the second's length the output length (unless `sharegpt_output_len`)."""
    conversations = [
        entry["conversations"]
        for entry in json.loads(Path(spec.path).read_text())
        if len(entry.get("conversations", [])) >= 2
    ]
    rng.shuffle(conversations)
    requests = []
    for turns in conversations:
        if len(requests) == num:
            break
        prompt = turns[0]["value"]
        output_len = spec.sharegpt_output_len or len(tokenizer.encode(turns[1]["value"], add_special_tokens=False))
        prompt_len = len(tokenizer.encode(prompt))
        if prompt_len >= 4 and output_len >= 4:  # vLLM's floor: too short a pair measures nothing
            requests.append(SampleRequest(prompt, prompt_len, output_len))
    return _enough(requests, num, spec.path)


def custom_requests(spec: DatasetSpec, num: int, tokenizer: TextTokenizer | None, rng: random.Random) -> list[SampleRequest]:
    """`num` prompts of a JSON-lines file (one {"prompt": ...} object a line), shuffled,
    each asking for `custom_output_len` tokens; lengths are counted when a tokenizer is
    given (else 0: the server's usage counts them)."""
    lines = [line for line in Path(spec.path).read_text().splitlines() if line.strip()]
    prompts = [json.loads(line)["prompt"] for line in lines]
    rng.shuffle(prompts)
    requests = [
        SampleRequest(prompt, len(tokenizer.encode(prompt)) if tokenizer else 0, spec.custom_output_len)
        for prompt in prompts[:num]
    ]
    return _enough(requests, num, spec.path)


def _enough(requests: list[SampleRequest], num: int, path: str | None) -> list[SampleRequest]:
    if len(requests) < num:
        raise ValueError(f"{path} has {len(requests)} usable prompts; --num-prompts asks for {num}")
    return requests


def sample_requests(
    spec: DatasetSpec, num: int, tokenizer: TextTokenizer | None, seed: int
) -> list[SampleRequest]:
    """`num` requests of the dataset `spec` names, drawn with `seed`."""
    if spec.needs_tokenizer and tokenizer is None:
        raise ValueError(
            f"--dataset-name {spec.name} needs the model's tokenizer: give --tokenizer (a Hugging Face "
            "directory or a GGUF file), or --model as a path"
        )
    draw = {
        "random": random_requests,
        "prefix_repetition": prefix_repetition_requests,
        "sharegpt": sharegpt_requests,
        "custom": custom_requests,
    }[spec.name]
    return draw(spec, num, tokenizer, random.Random(seed))
