"""srt's row scatter for the KV store: rows of new tokens copied into a layer's K or V buffer
at their slots, one copy per row (`srt._rust.scatter_rows`), where PyTorch's `index_copy_`
copies strided rows element by element (about 1.8 GB/s on the CPU).

For a few rows the scatter's fixed cost (the tensor views handed to Rust) exceeds
`index_copy_`'s, so `KVPool.store` takes it from the row count that `scatter_min_rows`
measures, once per process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from srt import _rust
from srt.tensor_views import numpy_view, strided_rows
from srt.timing import best_of

# The buffers' dtypes the scatter takes.
SCATTER_DTYPES = (torch.float32, torch.bfloat16)


def scatter_takes(buffer: torch.Tensor, *rows: torch.Tensor) -> bool:
    """Whether the scatter stores `rows` into `buffer`: one dtype among `SCATTER_DTYPES`, all on
    the CPU, no autograd."""
    return buffer.dtype in SCATTER_DTYPES and all(
        t.dtype == buffer.dtype and t.is_cpu and not t.requires_grad for t in (buffer, *rows)
    )


class RowScatter:
    """Stores rows into a contiguous `[slots, ...]` buffer (float32 or bf16): calling it with
    int64 `slots` and `rows` (`[len(slots), ...]`, of the buffer's dtype) sets `buffer[slots[i]]
    = rows[i]`, one copy per row. Rows may lie at any stride (k or v columns of the fused qkv
    output are read in place). Every slot is checked (`ValueError` outside the buffer) before
    any row is written; a repeated slot keeps its last row."""

    def __init__(self, buffer: torch.Tensor) -> None:
        self.buffer = buffer
        self.row_shape = buffer.shape[1:]
        self.width = math.prod(self.row_shape)
        # Made once: a numpy view costs microseconds, and a KV store runs per layer and pass.
        self._buffer = numpy_view(buffer)

    def __call__(self, slots: torch.Tensor, rows: torch.Tensor) -> None:
        if rows.shape[1:] != self.row_shape or rows.shape[0] != slots.numel():
            raise ValueError(
                f"{slots.numel()} rows of shape {tuple(self.row_shape)} cannot take rows of "
                f"shape {tuple(rows.shape)}"
            )
        if rows.shape[0] == 0:
            return
        span, stride = strided_rows(rows)
        _rust.scatter_rows(
            numpy_view(span), stride, self.width, slots.contiguous().numpy(), self._buffer
        )


# Row counts at which the row scatter and `index_copy_` are compared (see `scatter_min_rows`).
_PROBE_ROWS = (1, 4, 16, 64, 256)
# (dtype, row shape) -> the measured fewest rows for the row scatter.
_min_rows: dict[tuple[torch.dtype, tuple[int, ...]], float] = {}


def scatter_min_rows(dtype: torch.dtype, row_shape: Sequence[int]) -> float:
    """The fewest rows from which `RowScatter` stores rows of `row_shape` (a KV
    buffer's `[kv_heads, head_dim]`) and `dtype` faster than `index_copy_` (inf where it never
    does), measured once per process and key: both store strided rows (v's columns of a fused
    projection's output) at each of `_PROBE_ROWS`, best of a few calls (about a millisecond in
    all). The scatter's cost per call is mostly fixed (the tensor views handed to Rust);
    `index_copy_`'s grows faster with the rows."""
    key = (dtype, tuple(row_shape))
    if key not in _min_rows:
        wins = [_scatter_wins(dtype, key[1], rows) for rows in _PROBE_ROWS]
        _min_rows[key] = min_rows_from(wins)
    return _min_rows[key]


def min_rows_from(wins: list[bool]) -> float:
    """The first of `_PROBE_ROWS` from which the scatter won (`wins`, one per probe) at every
    larger one too, or inf when it lost the last."""
    losing = [rows for rows, won in zip(_PROBE_ROWS, wins, strict=True) if not won]
    larger = [rows for rows in _PROBE_ROWS if not losing or rows > losing[-1]]
    return float(larger[0]) if larger else math.inf


def _scatter_wins(
    dtype: torch.dtype, row_shape: tuple[int, ...], rows: int, repeats: int = 5
) -> bool:
    """Whether the row scatter stores `rows` strided rows faster than `index_copy_`."""
    width = math.prod(row_shape)
    fused = torch.zeros(rows, 3 * width, dtype=dtype)
    source = fused[:, width : 2 * width].view(rows, *row_shape)
    buffer = torch.zeros(rows + 1, *row_shape, dtype=dtype)
    slots = torch.arange(rows, 0, -1)
    scatter = RowScatter(buffer)
    return best_of(lambda: scatter(slots, source), repeats) < best_of(
        lambda: buffer.index_copy_(0, slots, source), repeats
    )
