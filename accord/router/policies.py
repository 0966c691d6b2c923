"""How the router orders an instance pool for one request: the first instance is
tried first, the next ones on a retry. Round-robin, least outstanding tokens, and
affinity (consistent hashing of a session id or the prompt's start, so a session
lands where its KV blocks are cached, while that instance's load stays within a cap)."""

from __future__ import annotations

import bisect
import hashlib
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .instances import Instance

#: Virtual points per instance on the hash ring: enough that keys spread evenly.
RING_POINTS = 64


@dataclass(frozen=True)
class RoutedRequest:
    """What a policy knows of a request: its affinity key (session id, else the start
    of its prompt) and its estimated tokens."""

    affinity_key: str
    tokens: int


def _hash(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


class RoundRobin:
    """Each request starts one instance further along the pool."""

    def __init__(self) -> None:
        self._counter = itertools.count()

    def order(self, instances: Sequence[Instance], request: RoutedRequest) -> list[Instance]:
        """The pool, rotated to this request's turn."""
        if not instances:
            return []
        start = next(self._counter) % len(instances)
        return [*instances[start:], *instances[:start]]


class LeastOutstanding:
    """The instance with the fewest outstanding (estimated) tokens first."""

    def order(self, instances: Sequence[Instance], request: RoutedRequest) -> list[Instance]:
        """The pool by outstanding tokens, then requests (stable: pool order breaks ties)."""
        return sorted(instances, key=lambda i: (i.outstanding_tokens, i.outstanding_requests))


class Affinity:
    """Consistent hashing of the affinity key onto the pool (an instance leaving moves
    only its own keys), unless the chosen instance holds more than `load_cap` tokens
    beyond the least loaded one: then the least loaded goes first."""

    def __init__(self, load_cap: int) -> None:
        self.load_cap = load_cap

    def order(self, instances: Sequence[Instance], request: RoutedRequest) -> list[Instance]:
        """The pool starting at the key's owner on the ring (or the least loaded)."""
        if not instances:
            return []
        ring = sorted((_hash(f"{instance.url}#{point}"), i) for i, instance in enumerate(instances)
                      for point in range(RING_POINTS))
        start = bisect.bisect(ring, (_hash(request.affinity_key), len(instances))) % len(ring)
        ordered = list(dict.fromkeys(instances[i] for _, i in ring[start:] + ring[:start]))
        least = min(instances, key=lambda i: i.outstanding_tokens)
        if ordered[0].outstanding_tokens > least.outstanding_tokens + self.load_cap:
            ordered.remove(least)
            ordered.insert(0, least)
        return ordered


#: Policy name (the --policy choices) -> a factory taking the affinity load cap.
POLICIES: dict[str, Callable[[int], RoundRobin | LeastOutstanding | Affinity]] = {
    "round_robin": lambda cap: RoundRobin(),
    "least_outstanding": lambda cap: LeastOutstanding(),
    "affinity": Affinity,
}
