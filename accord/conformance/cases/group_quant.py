"""Cases for group_quant_linear: 4- and 8-bit codes, symmetric and with zero points, at
one row (decode), a few rows and many rows, K of one group, K not a multiple of the
group (a partial last group, a partial last word), K in the thousands, per-channel
scales, act-order g_idx, every scales dtype, bias and the LM head's fp32 output;
zero points at their extremes against the codes furthest from them, and scales at
fp16's limits."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import torch

from ...op_contracts import PER_CHANNEL, group_count, packed_words
from ..case import Case, randn, seeded, uniform

#: (rows T, K, output rows N, group_size): decode, a partial last group (and, at 4 bits,
#: a partial last word; odd K ends mid-byte), a few rows, many rows (past a GEMM's row
#: tiles), K in the thousands, one group a row.
GROUP_QUANT_SHAPES = (
    (1, 256, 40, 128), (3, 200, 24, 64), (5, 100, 16, 32), (1, 101, 16, 32), (33, 96, 16, 32),
    (300, 128, 8, 128), (2, 4096, 16, 128), (4, 192, 8, PER_CHANNEL),
)
#: Scale magnitudes: codes reach 2**bits - 1 away from their zero, so fp16 outputs at
#: K = 4096 stay well inside fp16's range.
SCALE = (5e-3, 2e-2)
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
FP16_MAX = 65504.0
FP16_TINY = 2.0**-24


def random_words(generator: torch.Generator, rows: int, in_features: int, bits: int) -> torch.Tensor:
    """[rows, cdiv(K*bits, 32)] int32 rows of uniform random codes (every bit of the
    used words random, the padding bits past code K zero)."""
    words = torch.randint(-(2**31), 2**31, (rows, packed_words(in_features, bits)), generator=generator)
    return clear_padding(words, in_features, bits).to(torch.int32)


def filled_words(code: int, rows: int, in_features: int, bits: int) -> torch.Tensor:
    """Rows whose every code is `code`, packed."""
    word = sum(code << (bits * i) for i in range(32 // bits))
    words = torch.full((rows, packed_words(in_features, bits)), word, dtype=torch.int64)
    return clear_padding(words, in_features, bits).to(torch.int32)


def clear_padding(words: torch.Tensor, in_features: int, bits: int) -> torch.Tensor:
    """int64 words with the last word's bits past code K cleared, as signed int32 values."""
    used = in_features * bits % 32
    words = words & 0xFFFFFFFF
    if used:
        words[:, -1] &= (1 << used) - 1
    return torch.where(words >= 2**31, words - 2**32, words)


def random_scales(
    generator: torch.Generator, rows: int, groups: int, dtype: torch.dtype, magnitude: tuple[float, float] = SCALE,
) -> torch.Tensor:
    """Positive scales uniform in `magnitude`, rounded once to `dtype`."""
    return uniform(generator, (rows, groups), *magnitude).to(dtype)


def act_order(generator: torch.Generator, in_features: int, group_size: int) -> torch.Tensor:
    """GPTQ act-order's g_idx: channel k's group is the group of its place in a random
    permutation of the channels (so groups are scattered over K)."""
    permutation = torch.randperm(in_features, generator=generator)
    return (permutation // group_size).to(torch.int32)


def _case(name: str, **args: object) -> Case:
    defaults: dict[str, object] = {"zeros": None, "g_idx": None, "bias": None, "out_dtype": None}
    return Case("group_quant_linear", name, {**defaults, **args}, row_independent=True)


def group_quant_linear_cases(seed: int) -> Iterator[Case]:
    """Shape x bits x dtype (zero points on every other draw), then the variants."""
    draw = 0
    for tokens, depth, width, group_size in GROUP_QUANT_SHAPES:
        groups = group_count(depth, group_size)
        for bits in (4, 8):
            for dtype in (torch.float32, torch.bfloat16):
                g = seeded(seed, "group_quant_linear", tokens, depth, group_size, bits, dtype)
                scales_dtype = SCALE_DTYPES[draw % len(SCALE_DTYPES)]
                zeros = torch.randint(0, 1 << bits, (width, groups), generator=g, dtype=torch.uint8) if draw % 2 else None
                bias = randn(g, (width,), dtype) if tokens == 3 else None
                draw += 1
                name = f"int{bits} {'asym' if zeros is not None else 'sym'} T={tokens} K={depth} N={width} g={group_size}"
                yield _case(
                    name + (" bias" if bias is not None else ""),
                    x=randn(g, (tokens, depth), dtype), qweight=random_words(g, width, depth, bits),
                    scales=random_scales(g, width, groups, scales_dtype), zeros=zeros, bias=bias, bits=bits,
                    group_size=group_size,
                )
    yield from _variants(seed)
    yield from _illegal(seeded(seed, "group_quant_linear illegal"))


def _variants(seed: int) -> Iterator[Case]:
    g = seeded(seed, "group_quant_linear variants")
    depth, width, group_size, bits = 256, 24, 64, 4
    groups = group_count(depth, group_size)
    words = random_words(g, width, depth, bits)
    scales = random_scales(g, width, groups, torch.float16)
    zeros = torch.randint(0, 16, (width, groups), generator=g, dtype=torch.uint8)
    common = {"qweight": words, "scales": scales, "zeros": zeros, "bits": bits, "group_size": group_size}
    yield _case("int4 fp16 x bias", x=randn(g, (3, depth), torch.float16), bias=randn(g, (width,), torch.float16), **common)
    yield _case("int4 bf16 x fp32 out", x=randn(g, (3, depth), torch.bfloat16), out_dtype=torch.float32, **common)
    for bits in (4, 8):
        # Act-order: 4 groups scattered over K by a permutation, with and without zeros.
        g_idx = act_order(g, depth, group_size)
        yield _case(
            f"int{bits} act-order g_idx", x=randn(g, (5, depth), torch.bfloat16),
            qweight=random_words(g, width, depth, bits), scales=random_scales(g, width, groups, torch.bfloat16),
            zeros=torch.randint(0, 1 << bits, (width, groups), generator=g, dtype=torch.uint8), g_idx=g_idx,
            bits=bits, group_size=group_size,
        )
        yield _case(
            f"int{bits} act-order g_idx sym", x=randn(g, (1, depth), torch.float32),
            qweight=random_words(g, width, depth, bits), scales=random_scales(g, width, groups, torch.float16),
            g_idx=g_idx, bits=bits, group_size=group_size,
        )
        # Zero points at both ends of the code range, against the codes furthest away.
        top = (1 << bits) - 1
        for zero, code in ((0, top), (top, 0)):
            yield _case(
                f"int{bits} zero {zero} codes {code}", x=randn(g, (3, depth), torch.bfloat16),
                qweight=filled_words(code, width, depth, bits), scales=random_scales(g, width, groups, torch.bfloat16),
                zeros=torch.full((width, groups), zero, dtype=torch.uint8), bits=bits, group_size=group_size,
            )
        # Largest scales against small activations and subnormal ones against large, in
        # fp32, so both products stay finite and well inside fp32's range.
        for label, magnitude, x_scale in (("fp16-max", FP16_MAX, 1e-7), ("fp16-subnormal", FP16_TINY, 1e4)):
            yield _case(
                f"int{bits} {label} scales", x=randn(g, (3, depth), torch.float32, x_scale),
                qweight=random_words(g, width, depth, bits),
                scales=torch.full((width, groups), magnitude, dtype=torch.float16),
                zeros=torch.randint(0, 1 << bits, (width, groups), generator=g, dtype=torch.uint8), bits=bits,
                group_size=group_size,
            )


def _illegal(g: torch.Generator) -> Iterator[Case]:
    """The layout's own refusals: a row a word short, scales a group short, a group size
    of zero."""
    depth, width, group_size, bits = 200, 8, 64, 4
    groups = group_count(depth, group_size)
    legal = _case(
        "legal", x=randn(g, (2, depth), torch.float32), qweight=random_words(g, width, depth, bits),
        scales=random_scales(g, width, groups, torch.float16), bits=bits, group_size=group_size,
    )
    broken = {
        "qweight a word short": {"qweight": legal.args["qweight"][:, :-1].contiguous()},
        "scales a group short": {"scales": legal.args["scales"][:, :-1].contiguous()},
        "group_size 0": {"group_size": 0},
    }
    for name, change in broken.items():
        yield dataclasses.replace(
            legal, name=name, args={**legal.args, **change}, expect_refusal=True, row_independent=False
        )


CASES = {"group_quant_linear": group_quant_linear_cases}
