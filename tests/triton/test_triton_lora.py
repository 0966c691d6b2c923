"""The Triton multi-LoRA kernel (BGMV) matches the reference backend on every float
dtype: rows of several adapters and of none (-1) in one batch, a rank that is not a
power of two, activations that are a strided view, an output wider than one block;
and a row's result is the same bits whatever batch it runs in."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES


def _randn(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _operands(dtype: torch.dtype, tokens: int = 5, k: int = 72, n: int = 80, slots: int = 3, rank: int = 12):
    # x is a column slice of a wider tensor: the kernel reads it by its strides.
    x = _randn(tokens, k + 8, dtype=dtype, seed=0)[:, 4 : 4 + k]
    y = _randn(tokens, n, dtype=dtype, seed=1)
    lora_a = _randn(slots, rank, k, dtype=dtype, seed=2)
    lora_b = _randn(slots, rank, n, dtype=dtype, seed=3)
    return y, x, lora_a, lora_b


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_lora_linear_matches_reference_with_mixed_slots_and_base_rows(assert_matches_reference, dtype):
    y, x, lora_a, lora_b = _operands(dtype)
    slot_ids = torch.tensor([2, -1, 0, 2, -1], dtype=torch.int32)
    assert_matches_reference("lora_linear", y, x, lora_a, lora_b, slot_ids)


def test_rows_without_an_adapter_are_the_base_output_and_a_row_ignores_its_batch(triton_ops):
    y, x, lora_a, lora_b = _operands(torch.float32)
    slot_ids = torch.tensor([1, -1, 0, 1, 2], dtype=torch.int32)
    whole = triton_ops.lora_linear(y, x, lora_a, lora_b, slot_ids)
    assert torch.equal(whole[1], y[1])
    alone = triton_ops.lora_linear(y[3:4], x[3:4], lora_a, lora_b, slot_ids[3:4])
    assert torch.equal(whole[3:4], alone)
