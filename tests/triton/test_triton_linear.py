"""The Triton GEMM matches the reference on every float dtype, with and without bias,
for row counts across autotune classes, ragged K/N tiles and strided activations."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES


def _randn(*shape: int, dtype: torch.dtype, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("rows", [1, 19])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear_matches_reference(assert_matches_reference, dtype, rows, with_bias):
    x, weight = _randn(rows, 72, dtype=dtype), _randn(40, 72, dtype=dtype, seed=1, scale=0.1)
    bias = _randn(40, dtype=dtype, seed=2) if with_bias else None
    assert_matches_reference("linear", x, weight, bias)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 19])
def test_linear_gives_fp32_logits_from_half_operands(assert_matches_reference, dtype, rows):
    """out_dtype fp32 (the LM head): the fp32 accumulator is stored as it is, judged at
    fp32's tolerance against the reference's fp64 sum."""
    x, weight = _randn(rows, 72, dtype=dtype), _randn(40, 72, dtype=dtype, seed=1, scale=0.1)
    assert_matches_reference("linear", x, weight, None, torch.float32)


def test_linear_reads_strided_activations(assert_matches_reference):
    x = _randn(6, 64, dtype=torch.float32)[:, ::2]
    assert_matches_reference("linear", x, _randn(24, 32, dtype=torch.float32, seed=1))
