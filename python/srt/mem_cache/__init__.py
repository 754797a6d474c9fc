"""KV memory of the scheduler: the KV-slot allocator and the radix prefix cache (both in Rust).

`TokenToKVPoolAllocator` hands out KV slots; `RadixCache` maps token-id prefixes to the slots
that hold them. The scheduler owns one of each; evicted cache slots go back to the allocator.
"""

from __future__ import annotations

from srt.mem_cache.allocator import TokenToKVPoolAllocator
from srt.mem_cache.radix_cache import MatchResult, RadixCache

__all__ = ["MatchResult", "RadixCache", "TokenToKVPoolAllocator"]
