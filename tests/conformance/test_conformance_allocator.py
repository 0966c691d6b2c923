"""The poison allocator: unwritten slots stay recognisable, writes past a buffer's
ends land in guards that report them."""

from __future__ import annotations

import pytest
import torch

from accord.conformance.allocator import PoisonAllocator, count_poisoned

DTYPES = [torch.float32, torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.int32, torch.int64]


@pytest.mark.parametrize("dtype", DTYPES)
def test_fresh_buffers_are_entirely_poison(dtype: torch.dtype) -> None:
    buffer = PoisonAllocator(("out",))((3, 5), dtype, torch.device("cpu"))
    assert buffer.shape == (3, 5) and buffer.dtype == dtype
    assert count_poisoned(buffer) == 15


@pytest.mark.parametrize("dtype", DTYPES)
def test_written_elements_stop_counting_as_poison(dtype: torch.dtype) -> None:
    buffer = PoisonAllocator(("out",))((3, 5), dtype, torch.device("cpu"))
    buffer[1] = torch.ones(5).to(dtype)
    assert count_poisoned(buffer) == 10


def test_a_write_past_the_end_is_reported_as_a_guard_breach() -> None:
    allocator = PoisonAllocator(("out",))
    buffer = allocator((2, 4), torch.float32, torch.device("cpu"))
    buffer.zero_()
    assert allocator.breaches() == []
    torch.as_strided(buffer, (9,), (1,))[-1] = 1.0
    assert allocator.breaches() == ["out: 1 guard elements overwritten (out-of-bounds write)"]


def test_a_write_before_the_start_is_reported_as_a_guard_breach() -> None:
    allocator = PoisonAllocator(("out",))
    buffer = allocator((4,), torch.int32, torch.device("cpu"))
    torch.as_strided(buffer, (1,), (1,), buffer.storage_offset() - 1)[0] = 0
    assert len(allocator.breaches()) == 1


def test_adopted_tensors_keep_their_contents_inside_guards() -> None:
    allocator = PoisonAllocator()
    cache = torch.randn(2, 3)
    adopted = allocator.adopt("key_cache", cache)
    assert torch.equal(adopted, cache) and adopted.data_ptr() != cache.data_ptr()
    torch.as_strided(adopted, (7,), (1,))[-1] = 0.0
    assert allocator.breaches() == ["key_cache: 1 guard elements overwritten (out-of-bounds write)"]
