"""Reference GGUF block kernels: the blocks dequantised to fp64 from each format's
definition (ggml-quants.c's dequantize_row_*, read as a specification: one function per
format over all blocks at once); the quantised linear is then an fp64 GEMM rounded once,
the quantised embedding the looked-up rows rounded once."""

from __future__ import annotations

from typing import Callable

import torch

from ....op_contracts import GGUF_FORMATS
from ._registry import KERNELS


def _f16(blocks: torch.Tensor, at: int) -> torch.Tensor:
    """The fp16 field at byte `at` of each block, as fp64 [blocks, 1]."""
    return blocks[:, at : at + 2].contiguous().view(torch.float16).double()


def _low_high(codes: torch.Tensor) -> torch.Tensor:
    """Nibbles of [blocks, n] bytes as [blocks, 2n]: every low nibble, then every high one
    (the legacy formats' order: weight j in byte j's low nibble, j + n in its high)."""
    return torch.cat([codes & 0xF, codes >> 4], dim=1)


def _bits(packed: torch.Tensor, count: int) -> torch.Tensor:
    """Bit i of a little-endian bit field, for i < count: [blocks, count] of 0/1."""
    positions = torch.arange(count, device=packed.device)
    return (packed[:, positions // 8] >> (positions % 8).to(torch.uint8)) & 1


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * b[:, 2:34].contiguous().view(torch.int8).double()


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_low_high(b[:, 2:18]).double() - 8)


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _low_high(b[:, 4:20]).double() + _f16(b, 2)


def _five_bit(b: torch.Tensor, high_at: int) -> torch.Tensor:
    # qh's bit j is weight j's fifth bit (j < 32), over nibbles in _low_high's order.
    return (_low_high(b[:, high_at + 4 : high_at + 20]) | (_bits(b[:, high_at : high_at + 4], 32) << 4)).double()


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * (_five_bit(b, 2) - 16)


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _f16(b, 0) * _five_bit(b, 4) + _f16(b, 2)


def _crumbs(codes: torch.Tensor) -> torch.Tensor:
    """2-bit fields of Q2_K/Q3_K's qs [blocks, 64] in weight order: each 128-weight half
    reads its 32 bytes four times, at shifts 0, 2, 4, 6."""
    halves = codes.view(-1, 2, 1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=codes.device).view(1, 1, 4, 1)
    return ((halves >> shifts) & 3).reshape(-1, 256)


def _per_16(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """values [blocks, 256] times one scale [blocks, 16] per 16 weights."""
    return (values.view(-1, 16, 16) * scale.unsqueeze(-1)).reshape(-1, 256)


def _per_32(values: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """values [blocks, 256] times one scale [blocks, 8] per 32 weights."""
    return (values.view(-1, 8, 32) * scale.unsqueeze(-1)).reshape(-1, 256)


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    # Each scales byte serves 16 weights: its low nibble scales them (times d), its high
    # nibble is their min (times dmin), subtracted.
    scales, d, dmin = b[:, 0:16], _f16(b, 80), _f16(b, 82)
    mins = (dmin * (scales >> 4).double()).repeat_interleave(16, dim=1)
    return _per_16(_crumbs(b[:, 16:80]).double(), d * (scales & 0xF).double()) - mins


def _q3_k_scales(packed: torch.Tensor) -> torch.Tensor:
    """Q3_K's 16 six-bit scales from 12 bytes: scale i's low 4 bits are byte i's low
    nibble (i < 8) or byte i-8's high one; its high 2 bits are bits 2*(i//4) of byte
    8 + i%4. Stored with an offset of 32."""
    i = torch.arange(16, device=packed.device)
    low = torch.where(i < 8, packed[:, i % 8] & 0xF, packed[:, i % 8] >> 4)
    high = (packed[:, 8 + i % 4] >> (2 * (i // 4)).to(torch.uint8)) & 3
    return (low | (high << 4)).double() - 32


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    # Weight w's high bit is bit w // 32 of hmask byte w % 32; a clear bit subtracts 4.
    hmask = b[:, 0:32]
    w = torch.arange(256, device=b.device)
    high = (hmask[:, w % 32] >> (w // 32).to(torch.uint8)) & 1
    values = _crumbs(b[:, 32:96]).double() - 4 * (1 - high.double())
    return _per_16(values, _f16(b, 108) * _q3_k_scales(b[:, 96:108]))


def _k4_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 8 six-bit scales and 8 six-bit mins from 12 bytes (get_scale_min_k4):
    j < 4: scale = byte j & 63, min = byte j+4 & 63; else scale = (byte j+4 & 15) |
    (byte j-4 >> 6) << 4, min = (byte j+4 >> 4) | (byte j >> 6) << 4."""
    q = packed
    first_scales, first_mins = q[:, 0:4] & 63, q[:, 4:8] & 63
    last_scales = (q[:, 8:12] & 0xF) | ((q[:, 0:4] >> 6) << 4)
    last_mins = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return torch.cat([first_scales, last_scales], 1).double(), torch.cat([first_mins, last_mins], 1).double()


def _k_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Q4_K/Q5_K's 4-bit codes [blocks, 128] in weight order: each 64-weight chunk is 32
    bytes' low nibbles, then their high ones."""
    chunks = codes.view(-1, 4, 32)
    return torch.stack([chunks & 0xF, chunks >> 4], dim=2).reshape(-1, 256)


def _k_minus_mins(b: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    scales, mins = _k4_scales_mins(b[:, 4:16])
    return _per_32(values, _f16(b, 0) * scales) - (_f16(b, 2) * mins).repeat_interleave(32, dim=1)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _k_minus_mins(b, _k_nibbles(b[:, 16:144]).double())


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    # Weight w's fifth bit is bit w // 32 of qh byte w % 32.
    qh = b[:, 16:48]
    w = torch.arange(256, device=b.device)
    high = (qh[:, w % 32] >> (w // 32).to(torch.uint8)) & 1
    return _k_minus_mins(b, (_k_nibbles(b[:, 48:176]) | (high << 4)).double())


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    # Each 128-weight half: ql's 64 bytes give low nibbles (weights 0..63) then high ones
    # (64..127); qh's 32 bytes give 2 bits each for weights l, l+32, l+64, l+96.
    ql, qh = b[:, 0:128].reshape(-1, 2, 64), b[:, 128:192].reshape(-1, 2, 1, 32)
    low = torch.cat([ql & 0xF, ql >> 4], dim=2)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8, device=b.device).view(1, 1, 4, 1)
    high = ((qh >> shifts) & 3).reshape(-1, 2, 128)
    values = (low | (high << 4)).reshape(-1, 256).double() - 32
    scales = b[:, 192:208].contiguous().view(torch.int8).double()
    return _per_16(values, _f16(b, 208) * scales)


#: Each format's block decoder: [blocks, block_bytes] uint8 -> [blocks, block_size] fp64.
DECODERS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "Q8_0": _q8_0, "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": _q5_0, "Q5_1": _q5_1,
    "Q2_K": _q2_k, "Q3_K": _q3_k, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}


def dequantize(qweight: torch.Tensor, quant_type: str) -> torch.Tensor:
    """[N, row_bytes] packed rows of `quant_type` blocks -> their weights [N, K] in fp64."""
    fmt = GGUF_FORMATS[quant_type]
    rows = qweight.shape[0]
    blocks = qweight.contiguous().view(-1, fmt.block_bytes)
    return DECODERS[quant_type](blocks).reshape(rows, -1)


@KERNELS.register("quant_linear")
def quant_linear(
    x: torch.Tensor, qweight: torch.Tensor, bias: torch.Tensor | None, quant_type: str,
    out_dtype: torch.dtype | None, out: torch.Tensor,
) -> None:
    """out = x @ dequantise(qweight)^T (+ bias) in fp64, rounded once."""
    result = x.double() @ dequantize(qweight, quant_type).t()
    if bias is not None:
        result += bias.double()
    out.copy_(result)


@KERNELS.register("quant_embedding")
def quant_embedding(
    ids: torch.Tensor, qweight: torch.Tensor, quant_type: str, hidden_size: int, out_dtype: torch.dtype,
    out: torch.Tensor,
) -> None:
    """out = dequantise(qweight[ids]) in fp64, rounded once (an id outside the table
    raises IndexError, as torch's indexing does)."""
    out.copy_(dequantize(qweight[ids.long()], quant_type))
