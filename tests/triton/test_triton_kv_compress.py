"""The Triton kv_compress kernel pools DeepSeek-V4's paged compressor state as the
reference does: HCA windows and CSA's overlapping ones (window 0 without a predecessor),
block tables and window ids at their own index widths, with swiglu-free fp32 softmax."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES

BLOCK, RATE, DIM = 4, 4, 16


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize(("table_dtype", "window_dtype"), [(torch.int32, torch.int64), (torch.int64, torch.int32)])
def test_kv_compress_matches_the_reference(assert_matches_reference, dtype, overlap, table_dtype, window_dtype):
    generator = torch.Generator().manual_seed(0)
    width = (2 if overlap else 1) * DIM
    state = torch.randn(9, BLOCK, 2 * width, generator=generator).to(dtype)
    bias = torch.randn(RATE, width, generator=generator) * 0.5
    tables = torch.tensor([[3, 0, 7, 5], [1, 8, 2, 6]], dtype=table_dtype)
    seqs = torch.tensor([0, 0, 1, 1, 1], dtype=window_dtype)
    windows = torch.tensor([0, 3, 0, 1, 2], dtype=window_dtype)
    assert_matches_reference("kv_compress", state, bias, tables, seqs, windows, overlap=overlap)
