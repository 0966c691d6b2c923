"""Cases for quant_linear: every GGUF block format at one row (decode), a few rows and
many rows, K of one block, a few and thousands of weights, with and without bias, at
each activation dtype and with the LM head's fp32 output, and blocks whose fp16 scales
sit at fp16's limits (the largest finite value, the smallest subnormal). For
quant_embedding: every format at each output dtype, one id and several (repeated,
the table's first and last rows), int32 and int64 ids, rows of one block and of
thousands of weights."""

from __future__ import annotations

import dataclasses
from typing import Iterator

import torch

from ...op_contracts import GGUF_FORMATS, BlockFormat
from ..case import Case, randn, seeded

#: (rows T, blocks per row, output rows N): decode, a few rows, many rows (a backend's
#: tile paths: the cpu backend's token tile at 33, its dequantised tiles past 256), and a
#: row of thousands of weights (4096 in the 32-wide formats, 4608 in the k-quants).
QUANT_SHAPES = ((1, 2, 40), (3, 3, 24), (33, 1, 16), (300, 1, 8), (2, 0, 32))
THOUSANDS = 4096
#: The magnitude of the random fp16 scales: keeps fp16 outputs finite at K in the
#: thousands for every format's largest codes (Q6_K's reach 127 * 32).
SCALE = 1e-3
#: fp16's extremes: the largest finite value and the smallest positive subnormal.
FP16_MAX = 65504.0
FP16_TINY = 2.0**-24


def random_blocks(
    generator: torch.Generator, fmt: BlockFormat, rows: int, blocks: int, scale: float = SCALE,
) -> torch.Tensor:
    """[rows, blocks * block_bytes] uint8 of random `fmt` blocks: every code byte uniform,
    every fp16 field (scale, min) set to `scale` times a random sign, so every block is
    finite."""
    packed = torch.randint(0, 256, (rows * blocks, fmt.block_bytes), generator=generator, dtype=torch.uint8)
    for at in fmt.fp16_fields:
        sign = torch.randint(0, 2, (rows * blocks, 1), generator=generator) * 2 - 1
        packed[:, at : at + 2] = (sign * scale).to(torch.float16).view(torch.uint8)
    return packed.reshape(rows, blocks * fmt.block_bytes)


def _case(
    fmt: BlockFormat, name: str, x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> Case:
    args = {"x": x, "qweight": qweight, "bias": bias, "quant_type": fmt.name, "out_dtype": out_dtype}
    return Case("quant_linear", f"{fmt.name} {name}", args, row_independent=True)


def quant_linear_cases(seed: int) -> Iterator[Case]:
    """Format x shape x dtype, then bias, the fp32 head output and fp16's limits."""
    for fmt in GGUF_FORMATS.values():
        for tokens, blocks, width in QUANT_SHAPES:
            blocks = blocks or -(-THOUSANDS // fmt.block_size)
            depth = blocks * fmt.block_size
            for dtype in (torch.float32, torch.bfloat16):
                g = seeded(seed, "quant_linear", fmt.name, tokens, depth, dtype)
                x = randn(g, (tokens, depth), dtype)
                qweight = random_blocks(g, fmt, width, blocks)
                # The few-rows shape also carries a bias, at each of x's dtypes.
                bias = randn(g, (width,), dtype) if tokens == 3 else None
                name = f"T={tokens} K={depth} N={width}" + (" bias" if bias is not None else "")
                yield _case(fmt, name, x, qweight, bias)
        g = seeded(seed, "quant_linear extras", fmt.name)
        depth = 2 * fmt.block_size
        qweight = random_blocks(g, fmt, 24, 2)
        yield _case(fmt, "fp16 x bias", randn(g, (3, depth), torch.float16), qweight, randn(g, (24,), torch.float16))
        yield _case(fmt, "bf16 x fp32 out", randn(g, (3, depth), torch.bfloat16), qweight, out_dtype=torch.float32)
        # Largest scales against small activations and subnormal scales against large
        # ones, in fp32, so both products stay finite and well inside fp32's range.
        huge = random_blocks(g, fmt, 8, 2, FP16_MAX)
        yield _case(fmt, "fp16-max scales", randn(g, (3, depth), torch.float32, 1e-6), huge)
        tiny = random_blocks(g, fmt, 8, 2, FP16_TINY)
        yield _case(fmt, "fp16-subnormal scales", randn(g, (3, depth), torch.float32, 1e4), tiny)
        yield from _illegal(fmt, g)


def _illegal(fmt: BlockFormat, g: torch.Generator) -> Iterator[Case]:
    """The format's own refusals: a row one byte short of its blocks, and K that is not a
    whole number of blocks (the packed length matching K's bytes rounded down)."""
    depth = 2 * fmt.block_size
    x = randn(g, (2, depth), torch.float32)
    short = random_blocks(g, fmt, 8, 2)[:, :-1].contiguous()
    yield dataclasses.replace(_case(fmt, "qweight a byte short", x, short), expect_refusal=True, row_independent=False)
    ragged = randn(g, (2, depth + 16), torch.float32)
    yield dataclasses.replace(
        _case(fmt, "K not whole blocks", ragged, random_blocks(g, fmt, 8, 2)), expect_refusal=True,
        row_independent=False,
    )


#: (ids, blocks per row) of the embedding cases over a 40-row table: one token (decode),
#: several with a repeat and both ends of the table, and a row of thousands of weights.
EMBEDDING_IDS = (((7,), 1), ((39, 0, 5, 39, 12), 2), ((3, 38), 0))
EMBEDDING_ROWS = 40


def _embedding_case(fmt: BlockFormat, name: str, ids: torch.Tensor, qweight: torch.Tensor, depth: int,
                    out_dtype: torch.dtype) -> Case:
    args = {"ids": ids, "qweight": qweight, "quant_type": fmt.name, "hidden_size": depth, "out_dtype": out_dtype}
    return Case("quant_embedding", f"{fmt.name} {name}", args, row_independent=True)


def quant_embedding_cases(seed: int) -> Iterator[Case]:
    """Format x ids x output dtype, then the format's refusals."""
    for fmt in GGUF_FORMATS.values():
        for index, (ids, blocks) in enumerate(EMBEDDING_IDS):
            blocks = blocks or -(-THOUSANDS // fmt.block_size)
            depth = blocks * fmt.block_size
            g = seeded(seed, "quant_embedding", fmt.name, index)
            qweight = random_blocks(g, fmt, EMBEDDING_ROWS, blocks)
            for id_dtype in (torch.int32, torch.int64):
                for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
                    name = f"T={len(ids)} K={depth} {str(id_dtype)[6:]} ids -> {str(out_dtype)[6:]}"
                    yield _embedding_case(fmt, name, torch.tensor(ids, dtype=id_dtype), qweight, depth, out_dtype)
        g = seeded(seed, "quant_embedding refusals", fmt.name)
        depth, ids = 2 * fmt.block_size, torch.tensor([1, 2])
        short = random_blocks(g, fmt, 8, 2)[:, :-1].contiguous()
        yield dataclasses.replace(
            _embedding_case(fmt, "qweight a byte short", ids, short, depth, torch.float32), expect_refusal=True,
            row_independent=False,
        )
        yield dataclasses.replace(
            _embedding_case(fmt, "hidden_size not whole blocks", ids, random_blocks(g, fmt, 8, 2), depth + 16,
                            torch.float32),
            expect_refusal=True, row_independent=False,
        )


CASES = {"quant_linear": quant_linear_cases, "quant_embedding": quant_embedding_cases}
