"""The scheduler's KV memory bookkeeping (docs/design.md §3): which KV slots a request holds,
and how they pass to the radix cache.

Every KV slot is free (allocator), in the radix cache (evictable, or locked by the requests whose
prefix it is), or held by a request that runs. `CacheManager.check_invariants` verifies
free + evictable + locked + held = total, and that every request row in use has a holder.
When the cache swaps a request's slots for its own, the request's row in the runner's
`ReqToTokenPool` is stale from there on (`Req.row_synced`): its next batch rewrites it.
Without a radix cache (`--disable-radix-cache`) a request's slots go straight back to the
allocator.
"""

from __future__ import annotations

from array import array

from srt.managers.schedule_batch import Req
from srt.mem_cache import RadixCache, TokenToKVPoolAllocator
from srt.mem_cache.req_rows import ReqRowAllocator


class CacheManager:
    """Moves KV slots between the allocator, the radix cache and the requests that hold them."""

    def __init__(
        self,
        allocator: TokenToKVPoolAllocator,
        tree_cache: RadixCache | None,
        rows: ReqRowAllocator,
    ) -> None:
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.rows = rows

    def available(self) -> int:
        """Slots a new token can get: free ones, and cached ones no request locks."""
        evictable = self.tree_cache.evictable_size() if self.tree_cache is not None else 0
        return self.allocator.available_size() + evictable

    def alloc(self, n: int) -> array[int]:
        """`n` slots, evicting from the cache as needed (admission made sure there are)."""
        if self.tree_cache is not None and self.allocator.available_size() < n:
            self.tree_cache.evict(n - self.allocator.available_size())
        slots = self.allocator.alloc(n)
        if slots is None:
            raise RuntimeError(f"out of KV slots: {n} needed, admission should have prevented it")
        return slots

    def cache_unfinished(self, req: Req) -> None:
        """Puts a prefilled chunk into the cache and re-locks the request's prefix there, so the
        chunk is shared and counted as the cache's."""
        if self.tree_cache is None:
            return
        key = req.fill_ids()[: req.kv_len]
        self._insert(req, key)
        slots, node = self.tree_cache.match_prefix(key)
        self.tree_cache.inc_lock_ref(node)
        assert req.last_node is not None
        self.tree_cache.dec_lock_ref(req.last_node)
        req.kv_slots = slots
        req.prefix_len, req.last_node = len(slots), node

    def _insert(self, req: Req, key: array[int]) -> None:
        """Inserts the request's KV for `key` and frees its slots the cache already held: from
        the first of those on, the request's row must be written again."""
        assert self.tree_cache is not None
        cached = self.tree_cache.insert(key, req.kv_slots[: len(key)])
        if cached > req.prefix_len:
            self.allocator.free(req.kv_slots[req.prefix_len : cached])
            req.row_synced = min(req.row_synced, req.prefix_len)

    def release(self, req: Req) -> None:
        """Gives back everything `req` holds: its KV (into the cache when there is one), its
        lock and its row."""
        if req.row is not None:
            if self.tree_cache is not None:
                self._insert(req, req.fill_ids()[: req.kv_len])
                assert req.last_node is not None
                self.tree_cache.dec_lock_ref(req.last_node)
            else:
                self.allocator.free(req.kv_slots)
            self.rows.free([req.row])
        req.row, req.kv_slots, req.prefix_len, req.last_node = None, array("i"), 0, None
        req.row_synced = 0

    def flush(self) -> None:
        """Empties the radix cache; only while no request holds a lock in it."""
        if self.tree_cache is not None:
            self.tree_cache.evict(self.tree_cache.evictable_size())
            self.tree_cache.reset()

    def check_invariants(self, holders: list[Req], idle: bool) -> list[str]:
        """What is wrong with the KV bookkeeping (empty when all is well), given the requests
        that hold slots and rows and whether any request is in flight at all."""
        problems = []
        free = self.allocator.available_size()
        evictable = locked = 0
        if self.tree_cache is not None:
            evictable, locked = self.tree_cache.evictable_size(), self.tree_cache.protected_size()
            try:
                self.tree_cache.check_invariants()
            except Exception as e:  # InvariantError from Rust
                problems.append(f"radix tree: {e}")
        held = sum(req.held_slots for req in holders)
        if free + evictable + locked + held != self.allocator.size:
            problems.append(
                f"free {free} + evictable {evictable} + locked {locked} + held {held} "
                f"!= total {self.allocator.size}"
            )
        rows = self.rows.size - self.rows.available()
        if rows != len(holders):
            problems.append(f"{rows} request rows in use by {len(holders)} requests")
        if idle and locked:
            problems.append(f"{locked} slots still locked with no request in flight")
        return problems


def req_row(req: Req) -> int:
    """The request's row in the req-to-token pool (it must have one)."""
    assert req.row is not None, f"request {req.rid} has no row"
    return req.row
