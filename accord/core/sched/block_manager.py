"""Fixed-size KV blocks: per-sequence block tables, ref-counted sharing, and prefix
caching by a hash chain over full blocks (nano-vllm's seam, nothing else here).

A full block's key is a hash of (the previous block's key, its token ids), so equal
prefixes map to the same physical blocks and a hit is a table pointer, never a copy.
A sequence's chain starts at its LoRA adapter's root (`chain_root`), so the same tokens
under two adapters (or an adapter and the base) never share a block: their KV differs,
and sharing it would serve one tenant's adapter's KV to another's request.
The default hash is SHA-256, as vLLM's since CVE-2025-25183: with Python's `hash()` a
client can craft a prompt whose chain collides with another's and be served that
prompt's cached KV. A request's `cache_salt` (vLLM's field) salts its chain's root, so
only requests with the same salt share its blocks.

A block whose last reference goes away keeps its key and joins a free pool; its key is
forgotten only when it is taken for new tokens. Blocks of requests outside any agent
session join the shared pool, reused in LRU order; an agent session's blocks (its
history, which its next turn extends) join that session's pool, and are taken only
once the shared pool is empty, the least recently used session's first: LRU per
session, so one-off traffic churns through its own blocks, not a live session's prefix.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Hashable

from ..config import PrefixCachingHashAlgo

#: A block's key: the chain hash of its prefix and tokens.
BlockKey = Hashable
#: The chain's start (the parent of a sequence's first block) for the base model.
ROOT_KEY = b""


def chain_root(lora_int_id: int, cache_salt: str | None = None) -> BlockKey:
    """The parent of the first block of a sequence under LoRA adapter `lora_int_id`
    (0: the base model, ROOT_KEY), salted by `cache_salt` when given. An adapter's root
    is 12 bytes and a salted one 36, never the length of ROOT_KEY, of each other or of
    a SHA-256 parent (and token ids add 8 bytes each), so no such first block key can
    equal another root's or another block's."""
    root = ROOT_KEY if lora_int_id == 0 else b"lora" + lora_int_id.to_bytes(8, "little")
    if cache_salt is None:
        return root
    return b"salt" + hashlib.sha256(root + cache_salt.encode()).digest()


def _sha256_key(parent: BlockKey, token_ids: Sequence[int]) -> BlockKey:
    # Token ids as fixed-width int64 after the parent's 32-byte digest: the encoding
    # is injective, so only a SHA-256 collision could alias two prefixes.
    return hashlib.sha256(bytes(parent) + array("q", token_ids).tobytes()).digest()  # type: ignore[arg-type]


def _builtin_key(parent: BlockKey, token_ids: Sequence[int]) -> BlockKey:
    # Fast, but Python's hash of the parent is not collision-resistant: for trusted
    # clients only.
    return (hash(parent), tuple(token_ids))


#: The key hash of each `prefix_caching_hash_algo` choice.
PREFIX_HASH_ALGOS: dict[PrefixCachingHashAlgo, Callable[[BlockKey, Sequence[int]], BlockKey]] = {
    "sha256": _sha256_key,
    "builtin": _builtin_key,
}


@dataclass
class PrefixCacheCounters:
    """Prefix-cache traffic in tokens, as vLLM exports it (queries and hits)."""

    queries: int = 0
    hits: int = 0
    evictions: int = 0


class BlockManager:
    """Owns the physical KV blocks and every sequence's block table."""

    def __init__(
        self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True, hash_algo: PrefixCachingHashAlgo = "sha256"
    ) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        if hash_algo not in PREFIX_HASH_ALGOS:
            raise ValueError(f"prefix_caching_hash_algo must be one of {', '.join(PREFIX_HASH_ALGOS)}, got {hash_algo!r}")
        self._block_key = PREFIX_HASH_ALGOS[hash_algo]
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        # Unreferenced blocks outside any session, least recently freed first: new
        # tokens take from the front.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        # Unreferenced cached blocks of each agent session, sessions least recently
        # used first (each pool tail blocks first); taken once `_free` is empty.
        self._session_free: OrderedDict[str, OrderedDict[int, None]] = OrderedDict()
        self._session_of_block: dict[int, str] = {}
        self._key_of_block: dict[int, BlockKey] = {}
        self._block_of_key: dict[BlockKey, int] = {}
        self._tables: dict[str, list[int]] = {}
        # Keys of each sequence's full blocks registered so far.
        self._chain: dict[str, list[BlockKey]] = {}
        self.counters = PrefixCacheCounters()

    # -- queries -------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        """Blocks no sequence references (cached ones included: they are evictable)."""
        return len(self._free) + len(self._session_of_block)

    @property
    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self.num_blocks - self.num_free_blocks

    def session_blocks(self, session_id: str) -> int:
        """Unreferenced cached blocks held for agent session `session_id`."""
        return len(self._session_free.get(session_id, ()))

    def block_table(self, seq_id: str) -> list[int]:
        """The physical blocks of `seq_id`'s logical blocks, in order (empty if none)."""
        return self._tables.get(seq_id, [])

    def find_cached_prefix(self, token_ids: Sequence[int], max_tokens: int, root: BlockKey = ROOT_KEY) -> list[int]:
        """Cached blocks holding the longest run of full blocks that prefixes
        `token_ids` in the chain from `root` (chain_root), covering at most `max_tokens`
        tokens; counts one query."""
        if not self.enable_prefix_caching:
            return []
        blocks: list[int] = []
        for key in self._chain_keys(token_ids, max_tokens, root):
            block = self._block_of_key.get(key)
            if block is None:
                break
            blocks.append(block)
        self.counters.queries += max_tokens
        self.counters.hits += len(blocks) * self.block_size
        return blocks

    def chain_keys(self, token_ids: Sequence[int], max_tokens: int, root: BlockKey = ROOT_KEY) -> list[BlockKey]:
        """The keys of the full blocks among the first `max_tokens` of `token_ids` in the
        chain from `root` (chain_root): the same chain in every tier and on every
        instance with the same hash algorithm."""
        return list(self._chain_keys(token_ids, max_tokens, root))

    def _chain_keys(self, token_ids: Sequence[int], max_tokens: int, root: BlockKey = ROOT_KEY) -> Iterator[BlockKey]:
        size = self.block_size
        parent: BlockKey = root
        for start in range(0, (max_tokens // size) * size, size):
            parent = self._block_key(parent, token_ids[start : start + size])
            yield parent

    def registered_keys(self, seq_id: str) -> list[BlockKey]:
        """The keys of `seq_id`'s full blocks registered so far (cache_full_blocks)."""
        return self._chain.get(seq_id, [])

    # -- changes -------------------------------------------------------------------
    def allocate(self, seq_id: str, num_tokens: int, cached_blocks: Sequence[int] = ()) -> bool:
        """Grow `seq_id`'s table to hold `num_tokens` tokens, starting a new table with
        `cached_blocks` (from find_cached_prefix) when given. Returns False, changing
        nothing, when too few free blocks remain."""
        table = self._tables.get(seq_id)
        if cached_blocks and table:
            raise ValueError(f"{seq_id}: cached blocks can only start a new block table")
        have = len(table) if table else len(cached_blocks)
        needed = max(0, -(-num_tokens // self.block_size) - have)
        revived = sum(1 for block in cached_blocks if self.ref_counts[block] == 0)
        if needed + revived > self.num_free_blocks:
            return False
        if table is None:
            table = self._tables[seq_id] = []
            self._chain[seq_id] = []
        for block in cached_blocks:
            if self.ref_counts[block] == 0:
                self._unfree(block)
            self.ref_counts[block] += 1
            table.append(block)
            self._chain[seq_id].append(self._key_of_block[block])
        for _ in range(needed):
            table.append(self._take_free_block())
        return True

    def cache_full_blocks(
        self, seq_id: str, token_ids: Sequence[int], num_computed_tokens: int, root: BlockKey = ROOT_KEY
    ) -> None:
        """Register the blocks of `seq_id` that `num_computed_tokens` fills, so later
        sequences with the same prefix (from the same `root`) can reuse them. Call only
        for tokens whose KV the step being run writes."""
        if not self.enable_prefix_caching:
            return
        table, chain, size = self._tables[seq_id], self._chain[seq_id], self.block_size
        for index in range(len(chain), num_computed_tokens // size):
            parent = chain[-1] if chain else root
            key = self._block_key(parent, token_ids[index * size : (index + 1) * size])
            block = table[index]
            # An equal block computed concurrently keeps the cache slot; this copy stays
            # private to its sequence and is simply freed later.
            if key not in self._block_of_key and block not in self._key_of_block:
                self._block_of_key[key] = block
                self._key_of_block[block] = key
            chain.append(key)

    def free(self, seq_id: str, forget_cached: bool = False, session_id: str | None = None) -> None:
        """Drop `seq_id`'s references; blocks nobody else holds become free, tail
        blocks first so a shared prefix outlives the suffixes after it. With
        `forget_cached` (a failed step may not have written them) those blocks also
        leave the prefix cache. The cached ones of agent session `session_id` join its
        pool, which becomes the most recently used session."""
        pool = None
        if session_id is not None and self.enable_prefix_caching:
            pool = self._session_free.setdefault(session_id, OrderedDict())
            self._session_free.move_to_end(session_id)
        for block in reversed(self._tables.pop(seq_id, [])):
            self.ref_counts[block] -= 1
            if self.ref_counts[block] == 0:
                if forget_cached:
                    self._uncache(block)
                if pool is not None and block in self._key_of_block:
                    pool[block] = None
                    self._session_of_block[block] = session_id  # type: ignore[assignment]
                else:
                    self._free[block] = None
        if pool is not None and not pool:
            del self._session_free[session_id]
        self._chain.pop(seq_id, None)

    def reset_prefix_cache(self) -> int:
        """Forget the prefix-cache key of every block no sequence holds (vLLM's
        reset_prefix_cache, for benchmarks and after a weight update); returns how many
        were forgotten. Blocks in use keep theirs: a running sequence's blocks stay
        cached until it frees them, so a later request with its prefix still hits."""
        forgotten = sum(self._uncache(block) for block in self._free)
        for pool in self._session_free.values():
            forgotten += sum(self._uncache(block) for block in pool)
            self._free.update(pool)
        self._session_free.clear()
        self._session_of_block.clear()
        return forgotten

    def _unfree(self, block: int) -> None:
        """Take free `block` out of its pool (a cached block revived)."""
        session_id = self._session_of_block.pop(block, None)
        if session_id is None:
            del self._free[block]
            return
        pool = self._session_free[session_id]
        del pool[block]
        if not pool:
            del self._session_free[session_id]

    def _take_free_block(self) -> int:
        if self._free:
            block, _ = self._free.popitem(last=False)
        else:  # only sessions' blocks are left: the least recently used session's
            block = next(iter(next(iter(self._session_free.values()))))
            self._unfree(block)
        if self._uncache(block):
            self.counters.evictions += 1
        self.ref_counts[block] = 1
        return block

    def _uncache(self, block: int) -> bool:
        """Forget `block`'s prefix-cache key; returns whether it had one."""
        key = self._key_of_block.pop(block, None)
        if key is not None:
            del self._block_of_key[key]
        return key is not None
