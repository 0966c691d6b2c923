"""`speculative_config`: which proposer drafts tokens and how many, with vLLM's keys,
checked once at start so a bad combination is refused naming the key."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

#: The proposers accord runs.
BUILT_METHODS = ("ngram", "suffix", "draft_model", "mtp", "eagle", "eagle3")
#: The methods that draft with a model of their own (its KV cache in the target's blocks).
MODEL_METHODS = ("draft_model", "mtp", "eagle", "eagle3")
#: The methods whose model is a head over the target's hidden states, run on the
#: driver rank over the target's embedding or head (so one rank only, for now).
HEAD_METHODS = ("mtp", "eagle", "eagle3")
#: The methods whose model is a directory of its own, named by `model`.
DIRECTORY_METHODS = ("draft_model", "eagle", "eagle3")
#: vLLM's other methods: refused by name at start (never silently ignored), with why.
NOT_BUILT_METHODS = {
    "medusa": "Medusa heads are not built",
}


@dataclass(frozen=True)
class SpeculativeConfig:
    """A checked speculative decoding setup (vLLM's names).

    ngram (prompt lookup) proposes the `num_speculative_tokens` tokens that followed
    the latest earlier occurrence of the request's last n tokens, for the longest n in
    [prompt_lookup_min, prompt_lookup_max] that occurs; suffix decoding proposes the
    continuation of the longest suffix of the request's tokens (up to
    suffix_decoding_max_tree_depth) that occurred before, token by token with the
    continuation most of its copies share, while at least suffix_decoding_min_token_prob
    of them agree; draft_model runs the smaller model in `model` (same vocabulary)
    `num_speculative_tokens` times after each step, unsharded
    (`draft_tensor_parallel_size` 1); mtp runs the checkpoint's multi-token-prediction
    layer (DeepSeek-V3) over the target's hidden states, eagle and eagle3 the EAGLE head
    in `model` over them (EAGLE-3: over three of its layers' features). Requests stop getting proposals while at least
    `disable_by_batch_size` requests run. With `adaptive_num_speculative_tokens` each
    step checks, of each request's proposal, only the drafts expected to raise tokens
    per second (spec_decode/adaptive.py), from none up to `num_speculative_tokens`.
    """

    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_min_token_prob: float = 0.1
    disable_by_batch_size: int | None = None
    model: str | None = None
    draft_tensor_parallel_size: int | None = None
    adaptive_num_speculative_tokens: bool = False

    @classmethod
    def parse(cls, value: Mapping[str, Any] | str) -> SpeculativeConfig:
        """The config a dict (or its JSON text, as `--speculative-config` takes it)
        describes; ValueError naming the key for anything it cannot be."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as error:
                raise ValueError(f"speculative_config is not valid JSON: {error}") from None
        if not isinstance(value, Mapping):
            raise ValueError(f"speculative_config must be a JSON object, got {type(value).__name__}")
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {', '.join(map(repr, unknown))}; known: {', '.join(known)}")
        method = value.get("method")
        if method in NOT_BUILT_METHODS:
            raise ValueError(
                f"speculative_config.method {method!r} is not supported: {NOT_BUILT_METHODS[method]}; "
                f"use one of {', '.join(BUILT_METHODS)}"
            )
        if method not in BUILT_METHODS:
            raise ValueError(f"speculative_config.method must be one of {', '.join(BUILT_METHODS)}, got {method!r}")
        if "num_speculative_tokens" not in value:
            raise ValueError("speculative_config.num_speculative_tokens is required")
        for name in known[1:]:
            if name == "suffix_decoding_min_token_prob":
                if name in value and not (_is_int(value[name], False) or isinstance(value[name], float)):
                    raise ValueError(f"speculative_config.{name} must be a number, got {value[name]!r}")
            elif name == "adaptive_num_speculative_tokens":
                if name in value and not isinstance(value[name], bool):
                    raise ValueError(f"speculative_config.{name} must be true or false, got {value[name]!r}")
            elif name == "model":
                if name in value and not isinstance(value[name], str):
                    raise ValueError(f"speculative_config.model must be a model directory (a string), got {value[name]!r}")
            elif name in value and not _is_int(value[name], nullable=name in NULLABLE_INTS):
                raise ValueError(f"speculative_config.{name} must be an integer, got {value[name]!r}")
        config = cls(**value)
        config._check()
        return config

    def _check(self) -> None:
        if self.num_speculative_tokens < 1:
            raise ValueError(f"speculative_config.num_speculative_tokens must be at least 1, got {self.num_speculative_tokens}")
        if self.prompt_lookup_min < 1:
            raise ValueError(f"speculative_config.prompt_lookup_min must be at least 1, got {self.prompt_lookup_min}")
        if self.prompt_lookup_max < self.prompt_lookup_min:
            raise ValueError(
                f"speculative_config.prompt_lookup_max ({self.prompt_lookup_max}) must be at least "
                f"prompt_lookup_min ({self.prompt_lookup_min})"
            )
        if self.suffix_decoding_max_tree_depth < 1:
            raise ValueError(
                f"speculative_config.suffix_decoding_max_tree_depth must be at least 1, "
                f"got {self.suffix_decoding_max_tree_depth}"
            )
        if not 0.0 <= self.suffix_decoding_min_token_prob <= 1.0:
            raise ValueError(
                f"speculative_config.suffix_decoding_min_token_prob must be in [0, 1], "
                f"got {self.suffix_decoding_min_token_prob}"
            )
        if self.disable_by_batch_size is not None and self.disable_by_batch_size < 1:
            raise ValueError(f"speculative_config.disable_by_batch_size must be at least 1, got {self.disable_by_batch_size}")
        if self.method in DIRECTORY_METHODS and self.model is None:
            raise ValueError(
                f"speculative_config.model is required with method {self.method!r} (the draft's or head's directory)"
            )
        if self.method not in DIRECTORY_METHODS:
            for name in ("model", "draft_tensor_parallel_size"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"speculative_config.{name} is only taken with methods {', '.join(DIRECTORY_METHODS)}, "
                        f"not {self.method!r}"
                    )
        if self.draft_tensor_parallel_size not in (None, 1):
            raise ValueError(
                f"speculative_config.draft_tensor_parallel_size must be 1 (the draft runs unsharded on the "
                f"driver rank), got {self.draft_tensor_parallel_size}"
            )

    @property
    def num_lookahead_tokens(self) -> int:
        """KV slots a request needs past its step's tokens: a draft model writes the KV
        of its drafts (after the step's last token) while it proposes them."""
        return self.num_speculative_tokens if self.method in MODEL_METHODS else 0


#: Integer keys that may be null (off / the default).
NULLABLE_INTS = ("disable_by_batch_size", "draft_tensor_parallel_size")


def _is_int(value: Any, nullable: bool) -> bool:
    return (value is None and nullable) or (isinstance(value, int) and not isinstance(value, bool))
