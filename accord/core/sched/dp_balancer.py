"""Which data-parallel replica a new request goes to.

The least loaded replica, counted in outstanding tokens (prompt tokens not yet computed
plus output tokens still allowed), wins. Prefix affinity overrides that: a request whose
first KV block equals a recent request's goes to the same replica, whose prefix cache
may hold it, unless that replica is more than `affinity_slack` tokens busier than the
lightest (a hot prefix must not pin all traffic to one replica).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class DataParallelBalancer:
    """Chooses a replica per request from the replicas' outstanding tokens; remembers
    the replica of up to `capacity` recent first blocks for prefix affinity."""

    def __init__(self, block_size: int, affinity_slack: int, capacity: int = 4096) -> None:
        self.block_size = block_size
        self.affinity_slack = affinity_slack
        self.capacity = capacity
        self._replica_of_prefix: OrderedDict[tuple[int, ...], int] = OrderedDict()

    def choose(self, prompt_token_ids: Sequence[int], loads: Sequence[int]) -> int:
        """The replica for a request with this prompt, given each replica's outstanding
        tokens (ties go to the lowest replica)."""
        lightest = min(range(len(loads)), key=lambda replica: loads[replica])
        if len(prompt_token_ids) < self.block_size:
            return lightest  # no full block: nothing the prefix cache could share
        key = tuple(prompt_token_ids[: self.block_size])
        chosen = self._replica_of_prefix.get(key)
        if chosen is None or chosen >= len(loads) or loads[chosen] > loads[lightest] + self.affinity_slack:
            chosen = lightest
        self._replica_of_prefix[key] = chosen
        self._replica_of_prefix.move_to_end(key)
        while len(self._replica_of_prefix) > self.capacity:
            self._replica_of_prefix.popitem(last=False)
        return chosen
