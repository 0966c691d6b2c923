"""The block manager: ref-counted tables and hash-chained prefix caching."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from accord.core.sched.block_manager import PREFIX_HASH_ALGOS, ROOT_KEY, BlockManager

BLOCK_SIZE = 4


def test_equal_prefixes_share_physical_blocks() -> None:
    manager = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    tokens = list(range(10))
    assert manager.allocate("a", len(tokens))
    manager.cache_full_blocks("a", tokens, len(tokens))
    cached = manager.find_cached_prefix(tokens, max_tokens=len(tokens) - 1)
    assert manager.allocate("b", len(tokens), cached)
    assert manager.block_table("b")[:2] == manager.block_table("a")[:2]
    assert manager.block_table("b")[2] != manager.block_table("a")[2]


def test_partial_blocks_are_never_cached() -> None:
    manager = BlockManager(num_blocks=8, block_size=BLOCK_SIZE)
    tokens = list(range(6))
    manager.allocate("a", len(tokens))
    manager.cache_full_blocks("a", tokens, len(tokens))
    assert len(manager.find_cached_prefix(tokens, max_tokens=len(tokens))) == 1


def test_freed_cached_blocks_are_reused_until_evicted() -> None:
    manager = BlockManager(num_blocks=2, block_size=BLOCK_SIZE)
    tokens = list(range(8))
    manager.allocate("a", 8)
    manager.cache_full_blocks("a", tokens, 8)
    manager.free("a")
    assert manager.num_free_blocks == 2
    assert len(manager.find_cached_prefix(tokens, max_tokens=8)) == 2
    manager.allocate("b", 4)  # takes the least recently freed block: a's tail
    assert manager.find_cached_prefix(tokens, max_tokens=8) == manager.find_cached_prefix(tokens, max_tokens=4)
    assert manager.counters.evictions == 1


def test_allocation_beyond_capacity_fails_without_change() -> None:
    manager = BlockManager(num_blocks=2, block_size=BLOCK_SIZE)
    assert not manager.allocate("a", 9)
    assert manager.block_table("a") == [] and manager.num_free_blocks == 2


def test_prefix_caching_off_finds_nothing() -> None:
    manager = BlockManager(num_blocks=4, block_size=BLOCK_SIZE, enable_prefix_caching=False)
    manager.allocate("a", 8)
    manager.cache_full_blocks("a", list(range(8)), 8)
    assert manager.find_cached_prefix(list(range(8)), max_tokens=8) == []


# Token streams drawn from two templates so that random sequences share prefixes.
TEMPLATES = ([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 4, [1, 2, 3, 4, 9, 9, 9, 9] * 6)


class BlockManagerMachine(RuleBasedStateMachine):
    """Random add (with prefix hits) / append / free / evict sequences / reset the cache."""

    def __init__(self) -> None:
        super().__init__()
        self.manager = BlockManager(num_blocks=12, block_size=BLOCK_SIZE)
        self.tokens: dict[str, list[int]] = {}
        self.next_id = 0

    @rule(template=st.sampled_from(TEMPLATES), length=st.integers(1, 30), diverge=st.booleans())
    def add_sequence(self, template: list[int], length: int, diverge: bool) -> None:
        tokens = template[:length] + ([99] if diverge else [])
        seq_id = f"s{self.next_id}"
        self.next_id += 1
        cached = self.manager.find_cached_prefix(tokens, max_tokens=len(tokens) - 1)
        if self.manager.allocate(seq_id, len(tokens), cached):
            self.manager.cache_full_blocks(seq_id, tokens, len(tokens))
            self.tokens[seq_id] = tokens

    @precondition(lambda self: self.tokens)
    @rule(data=st.data(), count=st.integers(1, 6))
    def append_tokens(self, data: st.DataObject, count: int) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        tokens = self.tokens[seq_id] + [data.draw(st.integers(1, 12)) for _ in range(count)]
        if self.manager.allocate(seq_id, len(tokens)):
            self.manager.cache_full_blocks(seq_id, tokens, len(tokens))
            self.tokens[seq_id] = tokens

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def free_sequence(self, data: st.DataObject) -> None:
        seq_id = data.draw(st.sampled_from(sorted(self.tokens)))
        self.manager.free(seq_id)
        del self.tokens[seq_id]

    @rule()
    def reset_prefix_cache(self) -> None:
        held = {block for seq_id in self.tokens for block in self.manager.block_table(seq_id)}
        held_keys = {block: key for block, key in self.manager._key_of_block.items() if block in held}
        self.manager.reset_prefix_cache()
        assert self.manager._key_of_block == held_keys, "free blocks forgotten, held ones kept"
        assert set(self.manager._block_of_key.values()) == set(held_keys)

    @invariant()
    def ref_counts_match_table_entries(self) -> None:
        owners = Counter(block for seq_id in self.tokens for block in self.manager.block_table(seq_id))
        assert all(self.manager.ref_counts[b] == owners[b] for b in range(self.manager.num_blocks))
        assert self.manager.num_free_blocks == self.manager.num_blocks - len(owners)

    @invariant()
    def only_full_cached_blocks_are_shared(self) -> None:
        for seq_id, tokens in self.tokens.items():
            table = self.manager.block_table(seq_id)
            assert len(table) == len(set(table)) == -(-len(tokens) // BLOCK_SIZE)
            for index, block in enumerate(table):
                if self.manager.ref_counts[block] > 1:
                    assert (index + 1) * BLOCK_SIZE <= len(tokens)
                    # The shared block's key is the chain key of this sequence's prefix.
                    key = ROOT_KEY
                    for start in range(0, (index + 1) * BLOCK_SIZE, BLOCK_SIZE):
                        key = PREFIX_HASH_ALGOS["sha256"](key, tokens[start : start + BLOCK_SIZE])
                    assert self.manager._key_of_block[block] == key

    def teardown(self) -> None:
        for seq_id in list(self.tokens):
            self.manager.free(seq_id)
        assert self.manager.num_free_blocks == self.manager.num_blocks


TestBlockManagerProperties = BlockManagerMachine.TestCase
TestBlockManagerProperties.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestBlockManagerProperties.pytestmark = [pytest.mark.slow]


class _CollidingInt(int):
    """An int whose Python hash is forced, to stage the CVE-2025-25183 attack: two
    different prefixes whose builtin chain hashes are equal."""

    def __hash__(self) -> int:
        return 7


def test_sha256_keys_do_not_alias_prefixes_whose_builtin_hashes_collide() -> None:
    # Two different first blocks; a parent key's Python hash is all the builtin chain
    # keeps of it, so if those hashes collide, equal second blocks share one key.
    first_a, first_b, second = [1, 2, 3, 4], [5, 6, 7, 8], [9, 9, 9, 9]
    builtin, sha256 = PREFIX_HASH_ALGOS["builtin"], PREFIX_HASH_ALGOS["sha256"]
    # Stand-ins for two different parent keys whose Python hashes collide.
    assert builtin(_CollidingInt(1), second) == builtin(_CollidingInt(2), second)  # the attack works on builtin
    key_a, key_b = sha256(ROOT_KEY, first_a), sha256(ROOT_KEY, first_b)
    assert sha256(key_a, second) != sha256(key_b, second)


def test_sha256_prefix_cache_reuses_equal_prefixes_only() -> None:
    manager = BlockManager(num_blocks=8, block_size=BLOCK_SIZE, hash_algo="sha256")
    prompt = list(range(1, 2 * BLOCK_SIZE + 2))
    assert manager.allocate("a", len(prompt))
    manager.cache_full_blocks("a", prompt, len(prompt))
    assert manager.find_cached_prefix(prompt, len(prompt) - 1) == manager.block_table("a")[:2]
    other = [prompt[0] + 1, *prompt[1:]]  # differs in the first block only
    assert manager.find_cached_prefix(other, len(other) - 1) == []


def test_unknown_prefix_hash_algo_is_refused() -> None:
    with pytest.raises(ValueError, match="prefix_caching_hash_algo"):
        BlockManager(num_blocks=2, block_size=BLOCK_SIZE, hash_algo="md5")
