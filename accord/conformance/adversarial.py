"""Seeded adversarial cases: a fixed budget of draws per op on every conformance run,
each with sizes across block and tile boundaries (primes, powers of two and their
neighbours), values across the dtype's range (subnormals, exact ties, zeros, values as
large as the contract's fp32 arithmetic stays finite for) and, for index tensors that
take -1, a -1 at a position that moves from draw to draw (first, middle, last).

The hand-written cases pin each known bug class; these look for the ones nobody has
named yet. Draws follow from (seed, op, draw), so a failure repeats under its seed."""

from __future__ import annotations

import math
from typing import Callable, Iterator

import torch

from ..op_contracts import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES
from ..op_contracts.contracts.fp8 import GROUP
from .case import Case, seeded

#: Draws per op and run: the budget that keeps a default run's time bounded.
DRAWS_PER_OP = 4
#: Sizes at block and tile boundaries: 1, primes, powers of two and their neighbours.
BOUNDARY_SIZES = (1, 2, 3, 7, 13, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 257)


def _size(generator: torch.Generator, largest: int = 257) -> int:
    """One boundary size no larger than `largest`."""
    fitting = [s for s in BOUNDARY_SIZES if s <= largest]
    return fitting[int(torch.randint(len(fitting), (1,), generator=generator))]


def _pick(generator: torch.Generator, options: tuple) -> object:
    return options[int(torch.randint(len(options), (1,), generator=generator))]


def adversarial_values(
    generator: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, largest: float
) -> torch.Tensor:
    """Values of `dtype` mixing, element by element: normal ones, subnormals of the
    dtype, zeros, one value repeated exactly (ties), and magnitudes up to `largest`
    (both signs), each rounded once to the dtype."""
    info = torch.finfo(dtype)
    normal = torch.randn(shape, generator=generator, dtype=torch.float64)
    kind = torch.randint(8, shape, generator=generator)
    sign = torch.randint(2, shape, generator=generator) * 2 - 1
    magnitude = torch.rand(shape, generator=generator, dtype=torch.float64)
    values = normal.clone()
    values[kind == 4] = (magnitude * info.tiny * sign)[kind == 4]  # subnormal
    values[kind == 5] = 0.0
    values[kind == 6] = float(normal.reshape(-1)[0])  # an exact tie, repeated
    values[kind == 7] = (largest * (0.5 + magnitude / 2) * sign)[kind == 7]
    return values.to(dtype)


def _safe_largest(dtype: torch.dtype, growth: float) -> float:
    """The largest input magnitude for which an op whose intermediate grows like
    value**2 * `growth` stays within fp32 and `dtype` (so the reference has no Inf)."""
    ceiling = min(torch.finfo(dtype).max, torch.finfo(torch.float32).max)
    return math.sqrt(ceiling / growth) / 4


def _rms_norm(seed: int, draw: int) -> Case:
    g = seeded(seed, "adversarial rms_norm", draw)
    dtype = _pick(g, FLOAT_DTYPES)
    tokens, hidden = _size(g, 33), _size(g)
    x = adversarial_values(g, (tokens, hidden), dtype, _safe_largest(dtype, hidden))
    weight = adversarial_values(g, (hidden,), dtype, 4.0)
    return Case("rms_norm", f"adversarial {draw} T={tokens} H={hidden}",
                {"x": x, "weight": weight, "eps": 1e-6}, row_independent=True)


def _silu_and_mul(seed: int, draw: int) -> Case:
    g = seeded(seed, "adversarial silu_and_mul", draw)
    dtype = _pick(g, FLOAT_DTYPES)
    tokens, half = _size(g, 33), _size(g)
    x = adversarial_values(g, (tokens, 2 * half), dtype, _safe_largest(dtype, 1.0))
    return Case("silu_and_mul", f"adversarial {draw} T={tokens} I={half}", {"x": x}, row_independent=True)


def _linear(seed: int, draw: int) -> Case:
    g = seeded(seed, "adversarial linear", draw)
    dtype = _pick(g, FLOAT_DTYPES)
    tokens, depth, width = _size(g, 33), _size(g), _size(g, 129)
    largest = _safe_largest(dtype, depth)
    args = {
        "x": adversarial_values(g, (tokens, depth), dtype, largest),
        "weight": adversarial_values(g, (width, depth), dtype, largest) * depth**-0.5,
        "bias": None,
        "out_dtype": None,
    }
    return Case("linear", f"adversarial {draw} T={tokens} K={depth} N={width}", args, row_independent=True)


def _quantize_fp8(seed: int, draw: int) -> Case:
    g = seeded(seed, "adversarial quantize_fp8", draw)
    dtype, fp8_dtype = _pick(g, FLOAT_DTYPES), _pick(g, FP8_DTYPES)
    mode = _pick(g, ("per_tensor", "per_token", "per_group"))
    tokens, hidden = _size(g, 33), _size(g)
    x = adversarial_values(g, (tokens, hidden), dtype, _safe_largest(dtype, 1.0))
    args = {"x": x, "scale": None, "mode": mode, "group_size": GROUP, "fp8_dtype": fp8_dtype}
    return Case("quantize_fp8", f"adversarial {draw} {mode} T={tokens} H={hidden}", args,
                row_independent=mode != "per_tensor")


def _padding_slots(generator: torch.Generator, tokens: int, num_slots: int, draw: int) -> torch.Tensor:
    """Distinct slots with -1 at draw-dependent positions: the first, the middle and
    the last token in turn, and every token on the fourth draw."""
    slots = torch.randperm(num_slots, generator=generator)[:tokens]
    position = (0, tokens // 2, tokens - 1, None)[draw % 4]
    if position is None:
        slots[:] = -1
    else:
        slots[position] = -1
    return slots


def _reshape_and_cache(seed: int, draw: int) -> Case:
    g = seeded(seed, "adversarial reshape_and_cache", draw)
    dtype, index_dtype = _pick(g, FLOAT_DTYPES), _pick(g, INDEX_DTYPES)
    block_size, heads, head_dim = _pick(g, (16, 32)), _size(g, 3), _pick(g, (16, 64, 80))
    tokens = _size(g, 65)
    blocks = -(-tokens // block_size) + 1
    cache_shape = (blocks, block_size, heads, head_dim)
    largest = torch.finfo(dtype).max / 4
    args = {
        "key": adversarial_values(g, (tokens, heads, head_dim), dtype, largest),
        "value": adversarial_values(g, (tokens, heads, head_dim), dtype, largest),
        "key_cache": adversarial_values(g, cache_shape, dtype, 1.0),
        "value_cache": adversarial_values(g, cache_shape, dtype, 1.0),
        "slot_mapping": _padding_slots(g, tokens, blocks * block_size, draw).to(index_dtype),
        "k_scale": 1.0,
        "v_scale": 1.0,
    }
    return Case("reshape_and_cache", f"adversarial {draw} T={tokens} BS={block_size}", args)


def _greedy_sample(seed: int, draw: int) -> Case:
    """Greedy rows over a boundary-sized vocabulary whose maximum is tied at random
    positions (the first index wins), with adversarial logits around it."""
    g = seeded(seed, "adversarial sample", draw)
    dtype = _pick(g, FLOAT_DTYPES)
    rows, vocab = _size(g, 17), max(_size(g), 2)
    logits = adversarial_values(g, (rows, vocab), dtype, 100.0).float()
    top = float(logits.abs().max()) + 1
    for row in range(rows):
        logits[row, torch.randperm(vocab, generator=g)[: min(3, vocab)]] = top
    args = {
        "logits": logits.to(dtype),
        "temperature": torch.zeros(rows),
        "top_k": torch.zeros(rows, dtype=torch.int32),
        "top_p": torch.ones(rows),
        "min_p": torch.zeros(rows),
        "seeds": torch.arange(rows, dtype=torch.int64),
        "num_logprobs": 0,
    }
    return Case("sample", f"adversarial {draw} greedy ties B={rows} V={vocab}", args, row_independent=True)


#: The ops with an adversarial drawer, each called with (seed, draw number).
DRAWERS: dict[str, Callable[[int, int], Case]] = {
    "rms_norm": _rms_norm,
    "silu_and_mul": _silu_and_mul,
    "linear": _linear,
    "quantize_fp8": _quantize_fp8,
    "reshape_and_cache": _reshape_and_cache,
    "sample": _greedy_sample,
}


def adversarial_cases(op: str, seed: int) -> Iterator[Case]:
    """`op`'s DRAWS_PER_OP adversarial draws under `seed` (none for an op without a drawer)."""
    drawer = DRAWERS.get(op)
    if drawer is not None:
        for draw in range(DRAWS_PER_OP):
            yield drawer(seed, draw)
