"""The Triton cache writers store each token at its slot exactly as the reference does
(bit for bit, fp8 saturation included), skip negative slots and touch nothing else."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FLOAT_DTYPES, FP8_DTYPES, INDEX_DTYPES

#: Token t goes to flat slot SLOTS[t]; -1 is padding.
SLOTS = (5, -1, 0, 11)


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _poisoned(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A cache filled with a sentinel, so untouched slots are recognisable."""
    return torch.full(shape, 3.0).to(dtype)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("cache_dtype", FLOAT_DTYPES + FP8_DTYPES)
@pytest.mark.parametrize("slot_dtype", INDEX_DTYPES)
def test_reshape_and_cache_writes_what_the_reference_writes(triton_ops, reference_ops, cache_dtype, slot_dtype):
    source_dtype = torch.bfloat16 if cache_dtype in FP8_DTYPES else cache_dtype
    key, value = (_randn(4, 2, 8, seed=1) * 100).to(source_dtype), _randn(4, 2, 8, seed=2).to(source_dtype)
    slot_mapping = torch.tensor(SLOTS, dtype=slot_dtype)
    caches = {}
    for name, ops in (("triton", triton_ops), ("reference", reference_ops)):
        key_cache, value_cache = _poisoned((3, 4, 2, 8), cache_dtype), _poisoned((3, 4, 2, 8), cache_dtype)
        ops.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, k_scale=0.5, v_scale=0.125)
        caches[name] = (key_cache, value_cache)
    assert _same_bits(caches["triton"][0], caches["reference"][0])
    assert _same_bits(caches["triton"][1], caches["reference"][1])


def test_reshape_and_cache_leaves_slots_without_a_token_untouched(triton_ops):
    key_cache, value_cache = _poisoned((3, 4, 2, 8), torch.float16), _poisoned((3, 4, 2, 8), torch.float16)
    key = _randn(4, 2, 8).half()
    triton_ops.reshape_and_cache(key, key, key_cache, value_cache, torch.tensor(SLOTS))
    written = torch.zeros(12, dtype=torch.bool)
    written[[s for s in SLOTS if s >= 0]] = True
    assert (key_cache.view(12, -1)[~written] == 3.0).all()


@pytest.mark.parametrize("cache_dtype", FLOAT_DTYPES + FP8_DTYPES)
@pytest.mark.parametrize("slot_dtype", INDEX_DTYPES)
def test_concat_and_cache_mla_writes_what_the_reference_writes(triton_ops, reference_ops, cache_dtype, slot_dtype):
    source_dtype = torch.float16 if cache_dtype in FP8_DTYPES else cache_dtype
    kv_c, k_pe = (_randn(4, 32, seed=1) * 50).to(source_dtype), _randn(4, 16, seed=2).to(source_dtype)
    slot_mapping = torch.tensor(SLOTS, dtype=slot_dtype)
    caches = {}
    for name, ops in (("triton", triton_ops), ("reference", reference_ops)):
        kv_cache = _poisoned((3, 4, 48), cache_dtype)
        ops.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, scale=0.25)
        caches[name] = kv_cache
    assert _same_bits(caches["triton"], caches["reference"])


#: kv_convert's (source, destination) cache dtypes: up, down and across fp8 flavours.
CONVERSIONS = (
    (torch.float32, torch.bfloat16),
    (torch.bfloat16, torch.float32),
    (torch.float16, torch.float8_e4m3fn),
    (torch.float8_e4m3fn, torch.float8_e4m3fnuz),
    (torch.float8_e4m3fnuz, torch.float16),
)


@pytest.mark.parametrize(("src_dtype", "dst_dtype"), CONVERSIONS)
def test_kv_convert_writes_what_the_reference_writes_across_block_sizes(triton_ops, reference_ops, src_dtype, dst_dtype):
    # Values past the fp8 range after the scales (the conversion must saturate them);
    # within every source dtype's range (a cache writer saturates into fp8 too).
    source = (_randn(4, 8, 16, seed=3) * 100).clamp(-200, 200).to(src_dtype)  # blocks of 8
    src_slots, dst_slots = torch.tensor((30, 2, 17, 9)), torch.tensor(SLOTS)
    caches = {}
    for name, ops in (("triton", triton_ops), ("reference", reference_ops)):
        destination = _poisoned((3, 4, 16), dst_dtype)  # blocks of 4
        ops.kv_convert(source, destination, src_slots, dst_slots, src_scale=0.5, dst_scale=0.125)
        caches[name] = destination
    assert _same_bits(caches["triton"], caches["reference"])
    assert (caches["triton"].view(12, -1)[1].float() == 3.0).all()  # slot 1 has no token
