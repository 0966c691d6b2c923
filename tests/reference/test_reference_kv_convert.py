"""kv_convert moves each token's row from its source slot to its destination slot in
the destination's spec; the expected values here are worked by hand."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FP8_MAX

POISON = 7.0


def _cache(blocks: int, block_size: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.full((blocks, block_size, width), POISON).to(dtype)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_kv_convert_moves_rows_across_block_sizes_and_rounds_to_nearest_even(ops, slot_dtype) -> None:
    source = torch.zeros(3, 2, 4)  # block size 2
    # 1 + 2^-8 is half a bf16 ulp above 1 (ties to even: 1); 1 + 3 * 2^-8 is 1.5 ulps
    # (ties to even: 1 + 2^-6); 3.0 and -0.5 are exact.
    source[2, 1] = torch.tensor([1 + 2**-8, 1 + 3 * 2**-8, 3.0, -0.5])  # slot 5
    source[0, 0] = torch.tensor([2.0, -2.0, 0.25, 8.0])  # slot 0
    destination = _cache(2, 4, 4, torch.bfloat16)  # block size 4
    ops.kv_convert(source, destination, torch.tensor([5, 0], dtype=slot_dtype), torch.tensor([6, 1], dtype=slot_dtype))
    assert destination[1, 2].float().tolist() == [1.0, 1 + 2**-6, 3.0, -0.5]  # slot 6
    assert destination[0, 1].float().tolist() == [2.0, -2.0, 0.25, 8.0]  # slot 1
    assert int((destination.float() != POISON).any(dim=-1).sum()) == 2


def test_kv_convert_skips_negative_destination_slots(ops) -> None:
    source = torch.randn(2, 4, 8)
    destination = _cache(2, 4, 8, torch.float32)
    ops.kv_convert(source, destination, torch.tensor([3, 4, 5]), torch.tensor([-1, 2, -1]))
    assert torch.equal(destination[0, 2], source[1, 0])
    assert int((destination != POISON).any(dim=-1).sum()) == 1


@pytest.mark.parametrize("dst_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_kv_convert_rescales_fp8_to_fp8_and_saturates(ops, dst_dtype) -> None:
    # Stored values times src_scale 0.5 are 224, 1, -3, 0.125; divided by dst_scale.
    source = torch.tensor([[[448.0, 2.0, -6.0, 0.25]]]).to(torch.float8_e4m3fn)
    destination = _cache(1, 2, 4, dst_dtype)
    ops.kv_convert(source, destination, torch.tensor([0]), torch.tensor([1]), src_scale=0.5, dst_scale=0.25)
    assert destination[0, 1].float().tolist() == [FP8_MAX[dst_dtype], 4.0, -12.0, 0.5]


def test_kv_convert_reads_an_fp8_source_times_its_scale_into_a_float_cache(ops) -> None:
    source = torch.tensor([[[3.0, -0.5]]]).to(torch.float8_e4m3fn)
    destination = _cache(1, 1, 2, torch.float16)
    ops.kv_convert(source, destination, torch.tensor([0]), torch.tensor([0]), src_scale=4.0, dst_scale=8.0)
    assert destination[0, 0].tolist() == [12.0, -2.0]  # dst_scale applies to fp8 caches only
