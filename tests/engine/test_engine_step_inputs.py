"""The runner's vectorised per-step inputs against a plain per-request construction:
token ids, positions, slots, tables, lengths and offsets for decode, prefill-chunk and
mixed steps, buffers that grow past their first size, and full-width tables."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from accord.core.worker.step_inputs import StepInputs

BLOCK = 4


def _expected(tokens, tables, rows, computed, new, width):
    ids, positions, slots, qsl = [], [], [], [0]
    for row, start, count in zip(rows, computed, new):
        for pos in range(start, start + count):
            ids.append(tokens[row, pos])
            positions.append(pos)
            slots.append(tables[row, pos // BLOCK] * BLOCK + pos % BLOCK)
        qsl.append(qsl[-1] + count)
    return {
        "input_ids": ids, "positions": positions, "slot_mapping": slots, "query_start_loc": qsl,
        "seq_lens": [c + n for c, n in zip(computed, new)], "block_tables": [list(tables[r, :width]) for r in rows],
        "last_rows": [q - 1 for q in qsl[1:]],
    }


@pytest.mark.parametrize(
    "rows, computed, new",
    [
        ([2, 0, 5], [7, 0, 12], [1, 1, 1]),  # decode
        ([1, 3], [0, 5], [9, 3]),  # prefill chunks
        ([4, 0, 2, 1], [10, 0, 3, 15], [1, 6, 1, 2]),  # mixed
        ([0, 1, 2, 3, 4, 5], [0, 0, 0, 0, 0, 0], [20, 20, 20, 20, 20, 20]),  # past the first buffer sizes
    ],
)
@pytest.mark.parametrize("full_width", [False, True])
def test_flatten_matches_a_per_request_construction(rows, computed, new, full_width) -> None:
    g = np.random.default_rng(0)
    tokens = g.integers(0, 1000, (6, 32)).astype(np.int32)
    tables = g.integers(0, 100, (6, 8)).astype(np.int32)
    inputs = StepInputs(max_seqs=4, max_tokens=16, max_blocks_per_seq=8, block_size=BLOCK, device=torch.device("cpu"))
    inputs.flatten(tokens, tables, np.array([3]), np.array([30]), np.array([1]))  # a previous step's leftovers
    flat = inputs.flatten(tokens, tables, np.array(rows), np.array(computed), np.array(new), full_width=full_width)
    width = 8 if full_width else -(-max(c + n for c, n in zip(computed, new)) // BLOCK)
    want = _expected(tokens, tables, rows, computed, new, width)
    got = {
        "input_ids": flat.input_ids, "positions": flat.positions, "slot_mapping": flat.attn.slot_mapping,
        "query_start_loc": flat.attn.query_start_loc, "seq_lens": flat.attn.seq_lens,
        "block_tables": flat.attn.block_tables, "last_rows": flat.last_rows,
    }
    for name, value in got.items():
        assert value.tolist() == [int(v) if not isinstance(v, list) else [int(x) for x in v] for v in want[name]], name
    assert flat.input_ids.dtype == torch.int64 and flat.attn.slot_mapping.dtype == torch.int32
    assert flat.attn.block_tables.is_contiguous()
    assert flat.attn.max_query_len == max(new) and flat.attn.max_seq_len == max(want["seq_lens"])


def test_steps_in_turn_reuse_the_buffers() -> None:
    """Decode, a smaller decode, a prefill chunk, then decodes again on one StepInputs:
    what one step leaves in the buffers never leaks into the next."""
    g = np.random.default_rng(1)
    tokens = g.integers(0, 1000, (6, 32)).astype(np.int32)
    tables = g.integers(0, 100, (6, 8)).astype(np.int32)
    inputs = StepInputs(max_seqs=6, max_tokens=32, max_blocks_per_seq=8, block_size=BLOCK, device=torch.device("cpu"))
    steps = [
        ([0, 1, 2, 3], [5, 9, 2, 20], [1, 1, 1, 1]),
        ([4, 1], [7, 10], [1, 1]),
        ([2, 5, 0], [0, 3, 6], [3, 5, 2]),
        ([5, 2, 0], [8, 3, 8], [1, 1, 1]),
        ([3, 1, 0, 2, 4, 5], [21, 11, 9, 4, 8, 9], [1, 1, 1, 1, 1, 1]),
    ]
    for rows, computed, new in steps:
        flat = inputs.flatten(tokens, tables, np.array(rows), np.array(computed), np.array(new))
        width = -(-max(c + n for c, n in zip(computed, new)) // BLOCK)
        want = _expected(tokens, tables, rows, computed, new, width)
        assert flat.attn.query_start_loc.tolist() == want["query_start_loc"]
        assert flat.last_rows.tolist() == want["last_rows"]
        assert flat.attn.slot_mapping.tolist() == [int(v) for v in want["slot_mapping"]]
        assert flat.input_ids.tolist() == [int(v) for v in want["input_ids"]]
        assert flat.attn.seq_lens.tolist() == want["seq_lens"]
