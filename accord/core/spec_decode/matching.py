"""Where a token history's recent tail occurred before: for every earlier position
holding the last token, how many tokens before it also match the tail, found with one
numpy comparison per matched length (never a Python loop over the history)."""

from __future__ import annotations

import numpy as np


def tail_matches(history: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ends, lengths): each earlier position `ends[i]` whose token ends a copy of the
    history's last `lengths[i]` tokens (1 <= lengths[i] <= max_len), the copy lying
    wholly before the tail itself; in increasing position order."""
    last = len(history) - 1
    if last < 1:
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
    ends = np.flatnonzero(history[:last] == history[last])
    lengths = np.ones(len(ends), dtype=np.int64)
    alive = np.ones(len(ends), dtype=bool)
    for back in range(1, max_len):
        if not alive.any():
            break
        before = ends - back
        # A copy may not reach before the start, nor overlap the tail it copies.
        alive &= (before >= 0) & (history[np.maximum(before, 0)] == history[last - back])
        lengths += alive
    return ends, lengths
