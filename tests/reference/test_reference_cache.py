"""reshape_and_cache and concat_and_cache_mla store each token at its flat slot."""

from __future__ import annotations

import pytest
import torch

from accord.op_contracts import FP8_MAX

NUM_BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM = 4, 4, 2, 8
POISON = 7.0


def _poisoned_cache(dtype: torch.dtype = torch.float32, width: tuple[int, ...] = (KV_HEADS, HEAD_DIM)) -> torch.Tensor:
    return torch.full((NUM_BLOCKS, BLOCK_SIZE, *width), POISON).to(dtype)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_reshape_and_cache_writes_each_token_at_block_and_offset_of_its_slot(ops, slot_dtype) -> None:
    key, value = torch.randn(3, KV_HEADS, HEAD_DIM), torch.randn(3, KV_HEADS, HEAD_DIM)
    key_cache, value_cache = _poisoned_cache(), _poisoned_cache()
    slots = [13, 2, 6]  # block 3 offset 1, block 0 offset 2, block 1 offset 2
    ops.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor(slots, dtype=slot_dtype))
    for t, slot in enumerate(slots):
        block, offset = divmod(slot, BLOCK_SIZE)
        assert torch.equal(key_cache[block, offset], key[t])
        assert torch.equal(value_cache[block, offset], value[t])


def test_reshape_and_cache_leaves_the_cache_untouched_for_negative_slots(ops) -> None:
    key, value = torch.randn(3, KV_HEADS, HEAD_DIM), torch.randn(3, KV_HEADS, HEAD_DIM)
    key_cache, value_cache = _poisoned_cache(), _poisoned_cache()
    ops.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([-1, 5, -1]))
    written = torch.zeros(NUM_BLOCKS, BLOCK_SIZE, dtype=torch.bool)
    written[1, 1] = True
    assert torch.all(key_cache[~written] == POISON)
    assert torch.all(value_cache[~written] == POISON)
    assert torch.equal(key_cache[1, 1], key[1])


@pytest.mark.parametrize("fp8_dtype", [torch.float8_e4m3fn, torch.float8_e4m3fnuz])
def test_reshape_and_cache_fp8_stores_value_over_scale_saturated_to_the_fp8_range(ops, fp8_dtype) -> None:
    limit = FP8_MAX[fp8_dtype]
    k_scale, v_scale = 0.5, 2.0
    key = torch.tensor([[[1.0, -3.0, 1000.0, -1000.0]]])  # the last two overflow the range
    value = torch.tensor([[[4.0, -8.0, 0.0, 1e6]]])
    key_cache, value_cache = _poisoned_cache(fp8_dtype, (1, 4)), _poisoned_cache(fp8_dtype, (1, 4))
    ops.reshape_and_cache(key, value, key_cache, value_cache, torch.tensor([0]), k_scale=k_scale, v_scale=v_scale)
    assert key_cache[0, 0, 0].float().tolist() == [2.0, -6.0, limit, -limit]
    assert value_cache[0, 0, 0].float().tolist() == [2.0, -4.0, 0.0, limit]


def test_reshape_and_cache_fp8_round_trips_within_fp8_precision(ops) -> None:
    k_scale = 0.01
    key = torch.randn(5, KV_HEADS, HEAD_DIM)
    key_cache, value_cache = _poisoned_cache(torch.float8_e4m3fn), _poisoned_cache(torch.float8_e4m3fn)
    ops.reshape_and_cache(key, key, key_cache, value_cache, torch.arange(5), k_scale=k_scale)
    restored = key_cache.flatten(0, 1)[:5].float() * k_scale
    # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 relative (subnormals: 2^-10 * scale).
    assert torch.all((restored - key).abs() <= key.abs() / 16 + k_scale * 2**-10)


@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64])
def test_concat_and_cache_mla_stores_latent_then_rope_at_each_slot(ops, slot_dtype) -> None:
    latent_dim, rope_dim = 6, 2
    kv_c, k_pe = torch.randn(3, latent_dim), torch.randn(3, rope_dim)
    cache = _poisoned_cache(width=(latent_dim + rope_dim,))
    slots = [9, -1, 0]
    ops.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor(slots, dtype=slot_dtype))
    assert torch.equal(cache[2, 1], torch.cat([kv_c[0], k_pe[0]]))
    assert torch.equal(cache[0, 0], torch.cat([kv_c[2], k_pe[2]]))
    assert int((cache != POISON).any(dim=-1).sum()) == 2  # the -1 slot wrote nothing


def test_concat_and_cache_mla_fp8_divides_by_scale(ops) -> None:
    kv_c, k_pe = torch.tensor([[2.0, -4.0]]), torch.tensor([[8.0]])
    cache = _poisoned_cache(torch.float8_e4m3fn, (3,))
    ops.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([0]), scale=4.0)
    assert cache[0, 0].float().tolist() == [0.5, -1.0, 2.0]
