"""The free list of KV slots, SGLang's `TokenToKVPoolAllocator` (paged when `page_size > 1`).

The KV pool has `size + page_size` slots: page 0 (slot 0 at page size 1) is padding that is never
handed out, so a padded batch can point its unused positions at it. The work is done by
`srt._rust.TokenAllocator`; this facade is the only place the scheduler sees it from.

Slots are handed out as `array('i')` (int32: the model runner reads them with `torch.frombuffer`)
and taken back as any int32 buffer, or, slower, a list of ints.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from typing import TYPE_CHECKING, TypeAlias

from srt import _rust

if TYPE_CHECKING:
    from typing_extensions import Buffer

Ids: TypeAlias = "array[int] | Buffer | Sequence[int]"
"""A run of token or slot ids: an int32 buffer (`array('i')`, numpy int32), the fast path that
the Rust runtime copies out in one piece, or a list or tuple of ints."""


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

    def alloc(self, need_size: int) -> array[int] | None:
        """`need_size` slots (a multiple of the page size), or None when fewer are free."""
        return self._pool.alloc(need_size)

    def free(self, free_index: Ids) -> None:
        """Gives back slots; naming any slot of a page frees the whole page."""
        self._pool.free(free_index)

    def clear(self) -> None:
        """Frees every slot."""
        self._pool.clear()

    def is_allocated(self, slot: int) -> bool:
        """Whether `slot` is handed out (never true of the padding)."""
        return self._pool.is_allocated(slot)
