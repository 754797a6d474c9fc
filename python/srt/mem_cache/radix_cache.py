"""The prefix cache: SGLang's `RadixCache` over the Rust radix tree `srt._rust.RadixTree`.

Keys are token ids, values the KV slots that hold them. A request matches its prompt against
the cache, locks the node where the match ends while it runs (so its prefix cannot be evicted),
inserts its tokens and slots when it finishes (freeing its own slots for the part that was
cached already), and unlocks. When the allocator runs short, `evict` frees least recently used
unlocked leaves. Node handles are plain ints; a handle to an evicted node raises `ValueError`.

Token ids and slot ids come in as `array('i')` (int32, how srt carries token ids from the
tokenizer on; the Rust tree copies them out in one piece) or, slower, as lists of ints; slots come
back as `array('i')`, ready for `torch.frombuffer`.
"""

from __future__ import annotations

from array import array
from typing import NamedTuple

from srt import _rust
from srt.mem_cache.allocator import Ids, TokenToKVPoolAllocator


class MatchResult(NamedTuple):
    """The longest cached prefix of a key: its KV slots and the node where it ends."""

    device_indices: array[int]
    last_node: int


class RadixCache:
    """Token-id prefixes → KV slots, with lock counts and LRU eviction.

    With `page_size > 1` keys are matched and inserted in whole pages only. When an allocator
    is given, `evict` frees evicted slots into it.
    """

    def __init__(
        self,
        page_size: int = 1,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator | None = None,
    ) -> None:
        self._tree = _rust.RadixTree(page_size)
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator

    @property
    def page_size(self) -> int:
        """The number of tokens per page."""
        return self._tree.page_size

    @property
    def root_node(self) -> int:
        """The handle of the root (the empty prefix); locking it does nothing."""
        return self._tree.root()

    def match_prefix(self, key: Ids) -> MatchResult:
        """The slots of the longest cached prefix of `key` and the node where it ends.

        An edge matched part-way is split, so the node ends exactly at the match; the path
        counts as used now for LRU eviction.
        """
        slots, node = self._tree.match_prefix(key)
        return MatchResult(slots, node)

    def insert(self, key: Ids, value: Ids) -> int:
        """Caches `value` as the slots of `key`; returns how many leading tokens were cached.

        The caller still owns `value[:returned]` and should free it (the cache keeps its own
        slots for that prefix). With pages, a tail shorter than a page is not inserted.
        """
        return self._tree.insert(key, value)

    def inc_lock_ref(self, node: int) -> int:
        """Locks the path from `node` to the root; returns the change of the evictable size."""
        return self._tree.lock(node)

    def dec_lock_ref(self, node: int) -> int:
        """Undoes one `inc_lock_ref`; returns the change of the evictable size."""
        return self._tree.unlock(node)

    def evict(self, num_tokens: int) -> int:
        """Evicts LRU unlocked leaves until `num_tokens` slots are out or none are evictable,
        freeing their slots into the allocator (inside Rust); returns how many were evicted.
        """
        if self.token_to_kv_pool_allocator is None:
            raise ValueError("evict needs an allocator to free into; use evict_slots")
        return self._tree.evict_into(self.token_to_kv_pool_allocator._pool, num_tokens)

    def evict_slots(self, num_tokens: int) -> array[int]:
        """Evicts like `evict` but returns the slots instead of freeing them: the caller must."""
        return self._tree.evict(num_tokens)

    def evictable_size(self) -> int:
        """Slots held by unlocked nodes."""
        return self._tree.evictable_size()

    def protected_size(self) -> int:
        """Slots held by locked nodes."""
        return self._tree.protected_size()

    def total_size(self) -> int:
        """All slots held by the cache (counted node by node)."""
        return self._tree.total_size()

    def reset(self) -> None:
        """Drops every node and lock (the slots are not freed); all handles become stale."""
        self._tree.reset()

    def check_invariants(self) -> None:
        """Walks the tree and raises `srt._rust.InvariantError` if any invariant is broken."""
        self._tree.validate()
