"""Session fixtures for the model tests: the tiny checkpoints saved once, and
transformers' own outputs on them, the independent reference every test compares with.
Helpers live in tiny_models.py (a conftest is not importable by name: each test
directory has one)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from tiny_models import NEW_TOKENS, build_tiny_model, fixed_prompt, load_transformers


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """`checkpoint(name)`: the directory of tiny model `name`, saved once per session."""
    saved: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in saved:
            directory = tmp_path_factory.mktemp(name)
            build_tiny_model(name).save_pretrained(directory)
            saved[name] = directory
        return saved[name]

    return get


@pytest.fixture(scope="session")
def transformers_logits(checkpoint: Callable[[str], Path]) -> Callable[[str, torch.dtype], torch.Tensor]:
    """`transformers_logits(name, dtype)`: transformers' fp32 logits [64, V] for the test
    prompt, computed once per session."""
    cache: dict[tuple[str, torch.dtype], torch.Tensor] = {}

    def get(name: str, dtype: torch.dtype) -> torch.Tensor:
        if (name, dtype) not in cache:
            with torch.no_grad():
                logits = load_transformers(checkpoint(name), dtype)(torch.tensor([fixed_prompt()])).logits
            cache[name, dtype] = logits[0].float()
        return cache[name, dtype]

    return get


@pytest.fixture(scope="session")
def transformers_greedy(checkpoint: Callable[[str], Path]) -> Callable[[str], list[int]]:
    """`transformers_greedy(name)`: transformers' 32-token greedy continuation of the test
    prompt in fp32 (its own KV cache; no generation config or EOS stop involved)."""
    cache: dict[str, list[int]] = {}

    def get(name: str) -> list[int]:
        if name not in cache:
            model = load_transformers(checkpoint(name), torch.float32)
            with torch.no_grad():
                out = model(torch.tensor([fixed_prompt()]), use_cache=True)
                tokens = [int(out.logits[0, -1].argmax())]
                while len(tokens) < NEW_TOKENS:
                    out = model(torch.tensor([tokens[-1:]]), cache=out.cache, use_cache=True)
                    tokens.append(int(out.logits[0, -1].argmax()))
            cache[name] = tokens
        return cache[name]

    return get


@pytest.fixture(autouse=True)
def seeded() -> None:
    """Every test draws the same random inputs on every run."""
    torch.manual_seed(0)
