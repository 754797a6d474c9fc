"""The free list of KV slots, SGLang's `TokenToKVPoolAllocator` (paged when `page_size > 1`).

The KV pool has `size + page_size` slots: page 0 (slot 0 at page size 1) is padding that is never
handed out, so a padded batch can point its unused positions at it. The work is done by
`srt._rust.TokenAllocator`; this facade is the only place the scheduler sees it from.
"""

from __future__ import annotations

from collections.abc import Sequence

from srt import _rust


class TokenToKVPoolAllocator:
    """Allocates KV slots (whole pages of them) to requests and takes them back.

    A shortfall is not an error: `alloc` returns None and takes nothing. Freeing a slot that is
    not allocated (twice, never handed out, the padding, out of range) raises `ValueError`
    naming the slot and frees nothing of that call.
    """

    def __init__(self, size: int, page_size: int = 1) -> None:
        self._pool = _rust.TokenAllocator(size, page_size)

    @property
    def size(self) -> int:
        """The number of allocatable slots (the padding page excluded)."""
        return self._pool.size

    @property
    def page_size(self) -> int:
        """The number of slots per page."""
        return self._pool.page_size

    def available_size(self) -> int:
        """The number of free slots."""
        return self._pool.available()

    def alloc(self, need_size: int) -> list[int] | None:
        """`need_size` slots (a multiple of the page size), or None when fewer are free."""
        return self._pool.alloc(need_size)

    def free(self, free_index: Sequence[int]) -> None:
        """Gives back slots; naming any slot of a page frees the whole page."""
        if free_index:
            self._pool.free(free_index)

    def clear(self) -> None:
        """Frees every slot."""
        self._pool.clear()

    def is_allocated(self, slot: int) -> bool:
        """Whether `slot` is handed out (never true of the padding)."""
        return self._pool.is_allocated(slot)
