"""quantize_fp8 against per-granule amax scales and torch's own fp8 rounding, and
scaled_mm against dequantise-then-matmul."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accord.op_contracts import FP8_MAX

FP8 = [torch.float8_e4m3fn, torch.float8_e4m3fnuz]


def _group_scales(x: torch.Tensor, width: int, fp8_dtype: torch.dtype) -> torch.Tensor:
    """Expected scales, one per `width` consecutive columns of each row, granule by granule."""
    rows, cols = x.shape
    amax = [[x[r, c : c + width].abs().max().item() for c in range(0, cols, width)] for r in range(rows)]
    return torch.tensor(amax).clamp_min(1e-10) / FP8_MAX[fp8_dtype]


def _per_element(scales: torch.Tensor, x: torch.Tensor, mode: str) -> torch.Tensor:
    """Each element's scale: one per 128 columns (per_group) or per whole row (else)."""
    width = 128 if mode == "per_group" else x.shape[1]
    return scales.repeat_interleave(width, dim=1)[:, : x.shape[1]].expand_as(x)


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("mode", ["per_tensor", "per_token", "per_group"])
def test_quantize_scales_are_granule_amax_over_fp8_max(ops, mode, fp8_dtype) -> None:
    x = torch.randn(4, 200) * torch.tensor([[0.01], [1.0], [30.0], [1000.0]])
    _, scales = ops.quantize_fp8(x, mode=mode, fp8_dtype=fp8_dtype)
    if mode == "per_tensor":
        expected = _group_scales(x.flatten()[None], x.numel(), fp8_dtype)
    else:
        expected = _group_scales(x, 128 if mode == "per_group" else x.shape[1], fp8_dtype)
    torch.testing.assert_close(scales, expected, rtol=1e-6, atol=0)


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("mode", ["per_tensor", "per_token", "per_group"])
def test_quantize_values_equal_torchs_fp8_rounding_of_x_over_scale(ops, mode, fp8_dtype) -> None:
    x = torch.randn(3, 300) * 5
    q, scales = ops.quantize_fp8(x, mode=mode, fp8_dtype=fp8_dtype)
    assert q.dtype == fp8_dtype
    assert torch.equal(q.float(), (x / _per_element(scales, x, mode)).to(fp8_dtype).float())


@pytest.mark.parametrize("fp8_dtype", FP8)
def test_quantize_maps_each_granules_amax_to_fp8_max(ops, fp8_dtype) -> None:
    x = torch.randn(5, 64)
    q, _ = ops.quantize_fp8(x, mode="per_token", fp8_dtype=fp8_dtype)
    assert torch.equal(q.float().abs().amax(dim=1), torch.full((5,), FP8_MAX[fp8_dtype]))


@pytest.mark.parametrize("mode", ["per_tensor", "per_token", "per_group"])
def test_quantize_round_trip_error_is_within_half_an_fp8_ulp(ops, mode) -> None:
    x = torch.randn(4, 256)
    q, scales = ops.quantize_fp8(x, mode=mode)
    restored = q.float() * _per_element(scales, x, mode)
    # e4m3: 3 mantissa bits, so half an ulp is 1/16 relative; subnormals step 2^-9.
    assert torch.all((restored - x).abs() <= x.abs() / 16 + _per_element(scales, x, mode) * 2**-10)


def test_quantize_with_a_static_scale_saturates_values_beyond_the_range(ops) -> None:
    x = torch.tensor([[1.0, -2.0, 5000.0, -5000.0]])
    q, scales = ops.quantize_fp8(x, torch.tensor([[2.0]]), mode="per_tensor")
    assert scales.tolist() == [[2.0]]
    assert q.float().tolist() == [[0.5, -1.0, 448.0, -448.0]]


def test_quantize_all_zero_input_gets_the_minimum_scale_and_zero_values(ops) -> None:
    q, scales = ops.quantize_fp8(torch.zeros(2, 8), mode="per_token")
    torch.testing.assert_close(scales, torch.full((2, 1), 1e-10 / 448))
    assert torch.all(q.float() == 0)


def _fp8_operand(rows: int, cols: int, fp8_dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(rows, cols) * 50).clamp(-200, 200).to(fp8_dtype)


def _dequantised(stored: torch.Tensor, scale: torch.Tensor, scale_mode: str, block_rows: int) -> torch.Tensor:
    """stored * scale element by element: block scales tile `block_rows` x 128, the
    per-tensor and per-row ones broadcast."""
    if scale_mode != "block":
        return stored.double() * scale.double()
    tile = torch.empty(stored.shape, dtype=torch.float64)
    for i in range(stored.shape[0]):
        for j in range(0, stored.shape[1], 128):
            tile[i, j : j + 128] = float(scale[i // block_rows, j // 128])
    return stored.double() * tile


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize(
    "scale_mode,a_scale_shape,b_scale_shape",
    [("tensor", (1, 1), (1, 1)), ("row", (3, 1), (130, 1)), ("block", (3, 2), (2, 2))],
)
def test_scaled_mm_equals_linear_of_dequantised_operands(
    ops, fp8_dtype, scale_mode, a_scale_shape, b_scale_shape
) -> None:
    m, n, k = 3, 130, 200  # partial 128-blocks along N and K
    a, b = _fp8_operand(m, k, fp8_dtype), _fp8_operand(n, k, fp8_dtype)
    a_scale, b_scale = torch.rand(a_scale_shape) + 0.01, torch.rand(b_scale_shape) + 0.01
    bias = torch.randn(n)
    out = ops.scaled_mm(a, b, a_scale, b_scale, bias, scale_mode=scale_mode, out_dtype=torch.float32)
    a_values, b_values = _dequantised(a, a_scale, scale_mode, 1), _dequantised(b, b_scale, scale_mode, 128)
    expected = F.linear(a_values, b_values, bias.double())
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float16])
def test_scaled_mm_rounds_once_to_the_requested_dtype(ops, out_dtype) -> None:
    a, b = _fp8_operand(4, 64, torch.float8_e4m3fn), _fp8_operand(8, 64, torch.float8_e4m3fn)
    scale = torch.tensor([[0.01]])
    out = ops.scaled_mm(a, b, scale, scale, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    expected = (a.double() * 0.01) @ (b.double() * 0.01).T
    assert torch.equal(out, expected.to(out_dtype))
