"""Where a token history's recent tail occurred before: for every earlier position
holding the last token, how many tokens before it also match the tail, found with one
numpy comparison per matched length (never a Python loop over the history); and, for a
request whose history grows step by step, the same kept up to date with one numpy step
per new token (`TailMatchIndex`), so proposing does not rescan the history every step."""

from __future__ import annotations

import numpy as np


def tail_matches(history: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(ends, lengths): each earlier position `ends[i]` whose token ends a copy of the
    history's last `lengths[i]` tokens (1 <= lengths[i] <= max_len), the copy ending
    before the tail does; in increasing position order."""
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
        # A copy may not reach before the start of the history.
        alive &= (before >= 0) & (history[np.maximum(before, 0)] == history[last - back])
        lengths += alive
    return ends, lengths


class TailMatchIndex:
    """One growing history's match lengths: entry e (for every position before the
    last) is how many tokens ending at e match the history's tail, at most `max_len`
    (0: e does not hold the last token). A new token t at position L gives
    lengths'[e] = min(lengths[e - 1] + 1, max_len) where history[e] == t, else 0: one
    numpy step per new token, where `tail_matches` takes up to max_len."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self._lengths = np.empty(0, dtype=np.int64)
        self._num_tokens = 0

    def update(self, history: np.ndarray) -> np.ndarray:
        """The match lengths of `history`, which extends the history this index last saw
        (a request's tokens only grow); the array is the index's own, not to be modified."""
        seen, total = self._num_tokens, len(history)
        if seen == 0 or total < seen or total - seen >= self.max_len:
            # Far behind (a request left unproposed for a while): a rescan costs no more.
            ends, lengths = tail_matches(history, self.max_len)
            self._lengths = np.zeros(max(total - 1, 0), dtype=np.int64)
            self._lengths[ends] = lengths
        else:
            for last in range(seen, total):
                grown = np.empty(last, dtype=np.int64)
                grown[0] = 1  # a copy of the new token alone (the recurrence's lengths[-1] is 0)
                np.add(self._lengths, 1, out=grown[1:])
                np.minimum(grown, self.max_len, out=grown)
                grown *= history[:last] == history[last]
                self._lengths = grown
        self._num_tokens = total
        return self._lengths


class RequestTailIndexes:
    """A `TailMatchIndex` per request id, for a proposer that proposes for many
    requests; a history without an id gets a fresh index (a scan from scratch)."""

    def __init__(self, max_len: int) -> None:
        self.max_len = max_len
        self._indexes: dict[str, TailMatchIndex] = {}

    def lengths(self, history: np.ndarray, req_id: str | None) -> np.ndarray:
        """`history`'s match lengths (`TailMatchIndex.update`), from the request's index."""
        if req_id is None:
            return TailMatchIndex(self.max_len).update(history)
        index = self._indexes.get(req_id)
        if index is None:
            index = self._indexes[req_id] = TailMatchIndex(self.max_len)
        return index.update(history)

    def forget(self, req_id: str) -> None:
        """The request left the batch (finished or preempted): drop its index."""
        self._indexes.pop(req_id, None)
