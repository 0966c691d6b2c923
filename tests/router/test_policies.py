"""The router's policies as functions of the pool's state: the order in which a
request tries the instances."""

from __future__ import annotations

from accord.router.instances import Instance
from accord.router.policies import Affinity, LeastOutstanding, RoundRobin, RoutedRequest


def _pool(*loads: int) -> list[Instance]:
    instances = [Instance(f"http://10.0.0.{i}:8000") for i in range(len(loads))]
    for instance, load in zip(instances, loads):
        instance.outstanding_tokens = load
    return instances


def test_round_robin_starts_each_request_one_instance_further() -> None:
    pool, policy = _pool(0, 0, 0), RoundRobin()
    firsts = [policy.order(pool, RoutedRequest("k", 1))[0] for _ in range(6)]
    assert firsts == [pool[0], pool[1], pool[2], pool[0], pool[1], pool[2]]
    assert set(policy.order(pool, RoutedRequest("k", 1))) == set(pool)


def test_least_outstanding_tries_the_least_loaded_first() -> None:
    pool = _pool(300, 20, 100)
    assert LeastOutstanding().order(pool, RoutedRequest("k", 1)) == [pool[1], pool[2], pool[0]]


def test_affinity_keeps_a_key_on_one_instance_and_spreads_keys() -> None:
    pool, policy = _pool(0, 0, 0, 0), Affinity(load_cap=1000)
    owners = {key: policy.order(pool, RoutedRequest(key, 1))[0] for key in (f"session-{n}" for n in range(40))}
    assert all(policy.order(pool, RoutedRequest(key, 1))[0] is owner for key, owner in owners.items())
    assert len(set(owners.values())) == len(pool)


def test_affinity_moves_only_the_keys_of_an_instance_that_leaves() -> None:
    pool, policy = _pool(0, 0, 0, 0), Affinity(load_cap=1000)
    keys = [f"session-{n}" for n in range(40)]
    before = {key: policy.order(pool, RoutedRequest(key, 1))[0] for key in keys}
    gone = pool[2]
    after = {key: policy.order([i for i in pool if i is not gone], RoutedRequest(key, 1))[0] for key in keys}
    assert all(after[key] is before[key] for key in keys if before[key] is not gone)


def test_affinity_sends_a_key_elsewhere_once_its_instance_is_over_the_load_cap() -> None:
    pool, policy = _pool(0, 0), Affinity(load_cap=100)
    owner = policy.order(pool, RoutedRequest("session", 1))[0]
    other = pool[1] if owner is pool[0] else pool[0]
    owner.outstanding_tokens = 100  # at the cap: still the owner
    assert policy.order(pool, RoutedRequest("session", 1))[0] is owner
    owner.outstanding_tokens = 101
    assert policy.order(pool, RoutedRequest("session", 1)) == [other, owner]
