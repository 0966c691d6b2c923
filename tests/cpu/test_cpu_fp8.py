"""cpu scaled_mm against the reference for every scale granularity and fp8 flavour."""

from __future__ import annotations

import pytest
import torch

M, N, K = 5, 256, 384


def _scales(mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    shapes = {"tensor": ((1, 1), (1, 1)), "row": ((M, 1), (N, 1)), "block": ((M, K // 128), (N // 128, K // 128))}
    a_shape, b_shape = shapes[mode]
    return torch.rand(a_shape) + 0.1, torch.rand(b_shape) + 0.1


@pytest.mark.parametrize("fp8", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
@pytest.mark.parametrize("scale_mode", ["tensor", "row", "block"])
def test_scaled_mm_matches_reference(assert_matches_reference, fp8, scale_mode) -> None:
    a, b = torch.randn(M, K).to(fp8), torch.randn(N, K).to(fp8)
    bias = torch.randn(N, dtype=torch.bfloat16)
    assert_matches_reference("scaled_mm", a, b, *_scales(scale_mode), bias, scale_mode=scale_mode)


def test_scaled_mm_writes_fp32_out_dtype(assert_matches_reference) -> None:
    a, b = torch.randn(M, K).to(torch.float8_e4m3fn), torch.randn(N, K).to(torch.float8_e4m3fn)
    out, _ = assert_matches_reference("scaled_mm", a, b, *_scales("row"), scale_mode="row", out_dtype=torch.float32)
    assert out.dtype == torch.float32
