"""`ReqRowAllocator`: which rows of the model runner's `ReqToTokenPool` are free.

The scheduler hands a row to each request it admits and takes it back when the request is done or
retracted; the runner, which owns the pool's tensor, only writes the rows it is told about. Ints
only: the scheduler keeps no tensor.
"""

from __future__ import annotations


class ReqRowAllocator:
    """Rows 0..size-1 of a `ReqToTokenPool` (its padding row is never handed out)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._free_rows = list(range(size))

    def available(self) -> int:
        return len(self._free_rows)

    def alloc(self, n: int) -> list[int] | None:
        """n free rows, or None when fewer are free."""
        if n > len(self._free_rows):
            return None
        rows, self._free_rows = self._free_rows[:n], self._free_rows[n:]
        return rows

    def free(self, rows: list[int]) -> None:
        self._free_rows.extend(rows)
