"""The reference compressed-KV ops against independent formulations: the sliding branch
against paged_attention, HCA against dense attention over hand-built keys, the
compressor's pooling against a softmax written out, and the indexer's tie rule."""

from __future__ import annotations

import torch

BLOCK, HEADS, DIM, RATE, WINDOW = 4, 2, 8, 4, 5


def _one_sequence(length: int, width: int, blocks: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """A cache of per-position rows laid out through `blocks`, and the rows in order."""
    rows = torch.randn(length, width)
    cache = torch.randn(max(blocks) + 1, BLOCK, width)
    for p in range(length):
        cache[blocks[p // BLOCK], p % BLOCK] = rows[p]
    return cache, rows


def _metadata(length: int, queries: int, blocks: list[int]) -> dict[str, torch.Tensor]:
    return {
        "block_tables": torch.tensor([blocks], dtype=torch.int32),
        "seq_lens": torch.tensor([length], dtype=torch.int32),
        "query_start_loc": torch.tensor([0, queries], dtype=torch.int32),
    }


def test_sliding_branch_is_paged_attention_with_keys_as_values(ops) -> None:
    blocks, length, queries = [3, 0, 2, 1], 13, 6
    cache, _ = _one_sequence(length, DIM, blocks)
    q = torch.randn(queries, HEADS, DIM)
    meta = _metadata(length, queries, blocks)
    got = ops.compressed_attention(q, cache, None, None, None, **meta, scale=0.3, sliding_window=WINDOW)
    kv = cache.unsqueeze(2)
    want = ops.paged_attention(q, kv, kv, **meta, scale=0.3, sliding_window=WINDOW)
    torch.testing.assert_close(got, want)


def test_hca_sees_every_closed_window_and_the_sink_takes_its_share(ops) -> None:
    blocks, length = [2, 0, 3, 1], 14
    cache, rows = _one_sequence(length, DIM, blocks)
    entries_cache, entries = _one_sequence(length, DIM, blocks)  # entry w at row (w+1)*RATE-1
    q, sinks = torch.randn(1, HEADS, DIM), torch.randn(HEADS)
    got = ops.compressed_attention(
        q, cache, entries_cache, sinks, None, **_metadata(length, 1, blocks), scale=0.5, sliding_window=WINDOW,
        compress_rate=RATE,
    )
    keys = torch.cat([rows[length - WINDOW :], entries[[RATE - 1, 2 * RATE - 1, 3 * RATE - 1]]])
    logits = 0.5 * torch.einsum("hd,kd->hk", q[0], keys)
    probs = torch.softmax(torch.cat([logits, sinks[:, None]], dim=1), dim=1)[:, :-1]
    torch.testing.assert_close(got[0], probs @ keys)


def test_csa_pool_mixes_the_previous_window_first_half_with_this_window_second_half(ops) -> None:
    blocks, length = [1, 0, 2], 12
    state, rows = _one_sequence(length, 4 * DIM, blocks)
    bias = torch.randn(RATE, 2 * DIM)
    got = ops.kv_compress(
        state, bias, torch.tensor([blocks]), torch.tensor([0, 0]), torch.tensor([0, 2]), overlap=True
    )
    kv, gate = rows[:, : 2 * DIM], rows[:, 2 * DIM :] + bias.repeat(length // RATE, 1)
    first = (torch.softmax(gate[0:4, DIM:], dim=0) * kv[0:4, DIM:]).sum(0)
    slots_kv = torch.cat([kv[4:8, :DIM], kv[8:12, DIM:]])
    slots_gate = torch.cat([gate[4:8, :DIM], gate[8:12, DIM:]])
    third = (torch.softmax(slots_gate, dim=0) * slots_kv).sum(0)
    torch.testing.assert_close(got, torch.stack([first, third]))


def test_indexer_breaks_equal_scores_toward_the_lower_entry_and_pads_with_minus_one(ops) -> None:
    blocks, length = [0, 1, 2], 11  # two closed windows at the last query, none at the first
    keys = torch.ones(3, BLOCK, DIM)
    q, weights = torch.ones(length, HEADS, DIM), torch.ones(length, HEADS)
    ids = ops.indexer_topk(
        q, weights, keys, **_metadata(length, length, blocks), top_k=3, compress_rate=RATE, ids_dtype=torch.int64
    )
    assert ids[0].tolist() == [-1, -1, -1]
    assert ids[RATE - 1].tolist() == [0, -1, -1]
    assert ids[length - 1].tolist() == [0, 1, -1]
