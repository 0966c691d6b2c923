"""cpu cache writers against the reference: the caches they leave must be identical,
bit for bit (fp8 stores included), with padding slots (-1) skipped, on the C kernel and
on the torch path alike (the `glue_path` fixture)."""

from __future__ import annotations

import pytest
import torch

from accord.backends import get_backend
from accord.conformance import ConformanceRunner, Status, cases_for
from accord.op_contracts import OpDispatcher

NUM_BLOCKS, BLOCK_SIZE = 6, 4

pytestmark = pytest.mark.usefixtures("glue_path")


def _slots(tokens: int, index_dtype: torch.dtype) -> torch.Tensor:
    """Distinct shuffled slots, every third one padding (-1)."""
    slots = torch.randperm(NUM_BLOCKS * BLOCK_SIZE)[:tokens]
    slots[::3] = -1
    return slots.to(index_dtype)


def _run_on_both(cpu_ops, reference_ops, op: str, *args, caches: tuple[int, ...], **kwargs) -> None:
    """Call `op` on each backend with its own copy of the caches (the arguments at
    positions `caches`) and assert the caches come out identical."""
    results = []
    for ops in (cpu_ops, reference_ops):
        call = [a.clone() if i in caches else a for i, a in enumerate(args)]
        getattr(ops, op)(*call, **kwargs)
        results.append([call[i] for i in caches])
    for got, want in zip(*results):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    "dtype,cache_dtype",
    [
        (torch.float32, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.bfloat16, torch.float8_e4m3fn),
        (torch.float16, torch.float8_e4m3fnuz),
    ],
)
def test_reshape_and_cache_writes_what_the_reference_writes(
    cpu_ops, reference_ops, index_dtype, dtype, cache_dtype
) -> None:
    key, value = (torch.randn(9, 2, 8).mul(300).to(dtype) for _ in range(2))  # past the fp8 range too
    key_cache, value_cache = (torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 2, 8, dtype=cache_dtype) for _ in range(2))
    args = (key, value, key_cache, value_cache, _slots(9, index_dtype))
    _run_on_both(cpu_ops, reference_ops, "reshape_and_cache", *args, caches=(2, 3), k_scale=0.5, v_scale=3.0)


@pytest.mark.parametrize("cache_dtype", [torch.float32, torch.float8_e4m3fn])
def test_concat_and_cache_mla_writes_what_the_reference_writes(cpu_ops, reference_ops, cache_dtype) -> None:
    kv_c, k_pe = torch.randn(7, 16), torch.randn(7, 4)
    kv_cache = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 20, dtype=cache_dtype)
    args = (kv_c, k_pe, kv_cache, _slots(7, torch.int64))
    _run_on_both(cpu_ops, reference_ops, "concat_and_cache_mla", *args, caches=(2,), scale=0.25)


def test_reshape_and_cache_slot_past_the_cache_is_refused_not_written(cpu_ops) -> None:
    """A slot past the cache must raise (as index_copy_ does on the torch path), never
    write past the cache."""
    key, value = torch.randn(2, 2, 8), torch.randn(2, 2, 8)
    key_cache, value_cache = (torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 2, 8) for _ in range(2))
    with pytest.raises(IndexError):
        cpu_ops.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([0, NUM_BLOCKS * BLOCK_SIZE]))


def test_reshape_and_cache_sizes_that_disagree_raise_on_a_fast_path_too() -> None:
    """A dispatcher's fast path validates only a signature's first call: later calls with
    sizes that disagree must still raise (the torch path's error), not copy out of bounds."""
    ops = OpDispatcher(get_backend("cpu"))
    key_cache, value_cache = (torch.zeros(NUM_BLOCKS, BLOCK_SIZE, 2, 8) for _ in range(2))
    ops.reshape_and_cache(torch.randn(2, 2, 8), torch.randn(2, 2, 8), key_cache, value_cache, torch.tensor([0, 1]))
    with pytest.raises((RuntimeError, IndexError)):  # value holds fewer tokens than key
        ops.reshape_and_cache(torch.randn(3, 2, 8), torch.randn(1, 2, 8), key_cache, value_cache, torch.tensor([2, 3, 4]))
    with pytest.raises((RuntimeError, IndexError)):  # rows wider than the cache's
        ops.reshape_and_cache(torch.randn(1, 2, 16), torch.randn(1, 2, 16), key_cache, value_cache, torch.tensor([5]))


def test_kv_convert_meets_its_contract_on_every_conformance_case() -> None:
    """Every pair of cache dtypes and block sizes, fp8 scales and saturation: the
    converted cache is the reference's, bit for bit; illegal calls are refused."""
    runner = ConformanceRunner(get_backend("cpu"), get_backend("reference"))
    cases = cases_for("kv_convert")
    statuses = [runner.run_case(case).status for case in cases]
    assert statuses == [Status.REFUSED if case.expect_refusal else Status.PASS for case in cases]
