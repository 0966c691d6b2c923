"""FP8: a DeepSeek-style block-quantised checkpoint (made here by quantising the tiny
random model's weights) and `quantization="fp8"` at load, against the unquantised
model in bf16 as transformers runs it: logits within a bound, perplexity within 2%."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Callable

import pytest
import torch

from accord.backends import get_backend
from accord.core.model_loader.load import load_model
from accord.op_contracts import OpDispatcher
from tiny_models import build_tiny_model, load_transformers, write_block_fp8
from single_sequence import SingleSequenceRunner

BACKENDS = ("reference", "cpu")
STREAM_LEN = 96
#: fp8 e4m3 keeps 3 mantissa bits (a weight moves up to 1/16 of itself). Measured on
#: these models, a token's logits sit within ~2-4% of the logits' scale of bf16's; MoE
#: routing is discrete, so a few tokens whose expert choice flips under that noise move
#: further. Hence: 90% of tokens within 5%; perplexity, over every token, within 2%.
FP8_LOGITS_BOUND = 0.05
FP8_TOKEN_QUANTILE = 0.9
PERPLEXITY_TOLERANCE = 0.02
#: A random model whose layers outweigh its embeddings is chaotic (tiny weight noise
#: flips routing and compounds), and one with a weak head predicts near-uniformly, so
#: perplexity cannot see fp8 noise. Trained models have neither property; these
#: scalings give the tiny ones a dominant residual stream and a confident head.
EMBEDDING_SCALE = 20.0
HEAD_SCALE = 3.0
#: Fused block-fp8 parts must be whole 128-row tiles, so the MLPs here are 128 wide.
DEEPSEEK_FP8 = dict(moe_intermediate_size=128)


def save_conditioned_bf16(name: str, directory: Path, **overrides) -> Path:
    """Tiny model `name` with a dominant residual stream and a confident head, in bf16."""
    model = build_tiny_model(name, **overrides)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(EMBEDDING_SCALE)
        model.lm_head.weight.mul_(HEAD_SCALE)
    model.to(torch.bfloat16).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def bf16_deepseek(tmp_path_factory) -> Path:
    """The tiny DeepSeek-V3 (128-wide MLPs), conditioned, in bf16."""
    return save_conditioned_bf16("deepseek_v3", tmp_path_factory.mktemp("deepseek_bf16"), **DEEPSEEK_FP8)


@pytest.fixture(scope="module")
def fp8_deepseek(bf16_deepseek, tmp_path_factory) -> Path:
    """The same model with its linear weights block-quantised to fp8, config declaring it."""
    return write_block_fp8(bf16_deepseek, tmp_path_factory.mktemp("deepseek_fp8"))


@pytest.fixture(scope="module")
def bf16_llama(tmp_path_factory) -> Path:
    """The tiny Llama, conditioned, in bf16."""
    return save_conditioned_bf16("llama", tmp_path_factory.mktemp("llama_bf16"))


@functools.lru_cache(maxsize=None)
def token_stream(model_dir: Path) -> tuple[int, ...]:
    """A fixed stream the model itself finds likely: sampled (seeded) from transformers'
    fp32 model, so perplexity sits far below the vocabulary size and fp8 noise shows."""
    model = load_transformers(model_dir, torch.float32)
    generator = torch.Generator().manual_seed(7)
    tokens, cache = [1], None
    with torch.no_grad():
        while len(tokens) < STREAM_LEN:
            out = model(torch.tensor([tokens[-1:]]), cache=cache, use_cache=True)
            cache = out.cache
            tokens.append(int(torch.multinomial(torch.softmax(out.logits[0, -1], dim=-1), 1, generator=generator)))
    return tuple(tokens)


def perplexity(logits: torch.Tensor, tokens: tuple[int, ...]) -> float:
    """exp(mean negative log-likelihood of each next token)."""
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), torch.tensor(tokens[1:]))
    return math.exp(float(nll))


@functools.lru_cache(maxsize=None)
def transformers_bf16_logits(model_dir: Path, tokens: tuple[int, ...]) -> torch.Tensor:
    """transformers' logits for `tokens` from the unquantised model in bf16."""
    with torch.no_grad():
        return load_transformers(model_dir, torch.bfloat16)(torch.tensor([tokens])).logits[0].float()


def accord_logits(
    model_dir: Path, backend: str, tokens: tuple[int, ...], quantization: str | None = None
) -> torch.Tensor:
    """accord's logits for `tokens` with bf16 activations."""
    ops = OpDispatcher(get_backend(backend), strict=True)
    model = load_model(model_dir, ops, dtype=torch.bfloat16, quantization=quantization).model
    return SingleSequenceRunner(model, len(tokens)).step(list(tokens))


Case = Callable[[str], tuple[torch.Tensor, torch.Tensor, tuple[int, ...]]]


@pytest.fixture(scope="module")
def block_fp8_case(bf16_deepseek, fp8_deepseek) -> Case:
    """`case(backend)`: (accord's fp8 logits, transformers' bf16 logits, stream)."""
    tokens = token_stream(bf16_deepseek)
    expected = transformers_bf16_logits(bf16_deepseek, tokens)
    return lambda backend: (accord_logits(fp8_deepseek, backend, tokens), expected, tokens)


@pytest.fixture(scope="module", params=["llama", "deepseek"])
def load_time_fp8_case(request, bf16_llama, bf16_deepseek) -> Case:
    """`case(backend)` for a bf16 checkpoint quantised to fp8 at load."""
    model_dir = bf16_llama if request.param == "llama" else bf16_deepseek
    tokens = token_stream(model_dir)
    expected = transformers_bf16_logits(model_dir, tokens)
    return lambda backend: (accord_logits(model_dir, backend, tokens, quantization="fp8"), expected, tokens)


def token_quantile_diff(logits: torch.Tensor, reference: torch.Tensor) -> float:
    """The 90th percentile over tokens of max |diff| / max |reference|."""
    per_token = (logits - reference).abs().amax(dim=-1) / reference.abs().max()
    return float(per_token.quantile(FP8_TOKEN_QUANTILE))


def test_block_fp8_checkpoint_keeps_its_weights_in_fp8(fp8_deepseek):
    model = load_model(fp8_deepseek, OpDispatcher(get_backend("reference")), dtype=torch.bfloat16).model
    moe_layer = model.layers[1]
    assert moe_layer.feed_forward.experts.w13.dtype == torch.float8_e4m3fn
    assert moe_layer.attention.o_proj.weight.dtype == torch.float8_e4m3fn


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_fp8_logits_of_most_tokens_are_near_bf16(block_fp8_case, backend):
    logits, expected, _ = block_fp8_case(backend)
    assert token_quantile_diff(logits, expected) < FP8_LOGITS_BOUND


@pytest.mark.parametrize("backend", BACKENDS)
def test_block_fp8_perplexity_is_within_2_percent_of_bf16(block_fp8_case, backend):
    logits, expected, tokens = block_fp8_case(backend)
    assert perplexity(logits, tokens) == pytest.approx(perplexity(expected, tokens), rel=PERPLEXITY_TOLERANCE)


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_time_fp8_logits_of_most_tokens_are_near_bf16(load_time_fp8_case, backend):
    logits, expected, _ = load_time_fp8_case(backend)
    assert token_quantile_diff(logits, expected) < FP8_LOGITS_BOUND


@pytest.mark.parametrize("backend", BACKENDS)
def test_load_time_fp8_perplexity_is_within_2_percent_of_bf16(load_time_fp8_case, backend):
    logits, expected, tokens = load_time_fp8_case(backend)
    assert perplexity(logits, tokens) == pytest.approx(perplexity(expected, tokens), rel=PERPLEXITY_TOLERANCE)
